"""Every registered model family does what it declares (kerple.model.family.ModelFamily)."""

from __future__ import annotations

import pytest
import torch

from kerple.config import load_config
from kerple.model import Decoder, families

TINY = {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 32, "seq_length": 16,
        "max_position_embeddings": 16, "regular_thickness": 3, "attention_impl": "eager"}


def tiny_model(name: str) -> tuple[Decoder, object]:
    cfg = load_config([], {**TINY, "arch": name, "pos_emb": "kerple_log" if families.family(name).positional_embedding else "none"})
    return families.build_model(cfg, flex_compile=False).eval(), cfg


@pytest.mark.parametrize("name", families.names())
def test_declared_capabilities_hold(name: str) -> None:
    family = families.family(name)
    model, cfg = tiny_model(name)
    assert isinstance(model, Decoder)
    assert len(model.layers) == getattr(cfg.model, family.layer_count_key)
    for impl in family.attention_impls:
        model.set_attention(impl)
    model.set_attention("eager")
    tokens = torch.randint(0, 32, (1, 6))
    if family.kv_cache:
        cache = model.new_cache()
        torch.testing.assert_close(model(tokens, cache=cache), model(tokens), atol=1e-5, rtol=1e-5)
    else:
        with pytest.raises(ValueError):
            model.new_cache()
    if family.softmax_temperature:
        model.set_temperature(0.7)
    else:
        with pytest.raises(ValueError):
            model.set_temperature(0.7)
    if family.attention_window:
        model.set_attention(window=4)
    else:
        with pytest.raises(ValueError):
            model.set_attention(window=4)


@pytest.mark.parametrize("name", families.names())
def test_recorded_arguments_are_config_keys(name: str) -> None:
    _, cfg = tiny_model(name)
    for key in families.family(name).recorded_args:
        assert hasattr(cfg.model, key), key
    assert set(families.family(name).legacy_args) <= set(families.family(name).recorded_args)


def test_an_unknown_family_is_named() -> None:
    with pytest.raises(KeyError, match="unknown model.arch 'gtp'; choose one of gpt, regulargpt"):
        families.family("gtp")
