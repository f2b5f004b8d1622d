"""build_model from a real Config, initialization, refusals, and a training step per embedding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kerple import positional
from kerple.config import load_config
from kerple.model import GPTModel, build_model, unsupported_reason
from kerple.positional.base import PositionKind
from model_helpers import VOCAB, supported_impls, tiny_model

TINY = {
    "num_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "seq_length": 32,
    "vocab_size": 60,
    "make_vocab_size_divisible_by": 8,
    "train_iters": 0,
}


def test_build_model_reads_every_section() -> None:
    cfg = load_config(
        [], {**TINY, "pos_emb": "kerple_power_ap_", "attention_impl": "sdpa", "attention_window": 8, "gpt_j_residual": True}
    )
    model = build_model(cfg)
    assert isinstance(model, GPTModel)
    assert model.positional.__class__ is positional.family("kerple_power")
    assert model.attention_impl == "sdpa" and model.attention_window == 8
    assert model.vocab_size == cfg.model.padded_vocab_size == 64
    assert model.layers[0].gpt_j_residual
    logits = model(torch.randint(0, 60, (1, 16)))
    assert logits.shape == (1, 16, 64)


def test_build_model_passes_positional_options() -> None:
    cfg = load_config([], {**TINY, "pos_emb": "rotary", "rotary_pct": 0.5})
    assert build_model(cfg).positional.rotary_ndims == 4


def test_build_model_learned_table_size() -> None:
    cfg = load_config([], {**TINY, "pos_emb": "learned", "max_position_embeddings": 48})
    assert build_model(cfg).state_dict()["positional.position_embeddings.weight"].shape == (48, 32)


def test_initialization_follows_neox() -> None:
    """N(0, 0.02) weights, N(0, 0.02/sqrt(2L)) output projections, zero biases, unit norms (docs/reference-format.md §4)."""
    torch.manual_seed(0)
    pe = positional.build("none", num_heads=8, head_dim=32, hidden_size=256, max_positions=64)
    model = GPTModel(num_layers=8, hidden_size=256, num_attention_heads=8, padded_vocab_size=512, positional=pe)
    state = model.state_dict()
    out_std = 0.02 / math.sqrt(2 * 8)
    for key, expected in [
        ("embedding.word_embeddings.weight", 0.02),
        ("layers.0.attention.query_key_value.weight", 0.02),
        ("layers.0.mlp.dense_h_to_4h.weight", 0.02),
        ("lm_head.weight", 0.02),
        ("layers.0.attention.dense.weight", out_std),
        ("layers.7.mlp.dense_4h_to_h.weight", out_std),
    ]:
        assert state[key].std().item() == pytest.approx(expected, rel=0.05), key
    assert all(state[key].abs().sum() == 0 for key in state if key.endswith(".bias") and "norm" not in key)
    assert torch.equal(state["final_norm.weight"], torch.ones(256))


@pytest.mark.parametrize(
    "method,expected", [("small_init", math.sqrt(2 / (5 * 256))), ("wang_init", 2 / 8 / math.sqrt(256))]
)
def test_named_init_methods(method: str, expected: float) -> None:
    pe = positional.build("none", num_heads=8, head_dim=32, hidden_size=256, max_positions=64)
    model = GPTModel(
        num_layers=8, hidden_size=256, num_attention_heads=8, padded_vocab_size=512, positional=pe,
        init_method=method, output_layer_init_method=method,
    )
    assert model.layers[0].mlp.dense_4h_to_h.weight.std().item() == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize(
    "keys,weight_std,output_std",
    [
        ({"init_method_std": 0.05}, 0.05, 0.05 / math.sqrt(2 * 4)),
        ({"init_method": "small_init", "output_layer_init_method": "wang_init"}, math.sqrt(2 / (5 * 128)),
         2 / 4 / math.sqrt(128)),
    ],
)
def test_config_init_keys_set_every_weight_std(keys: dict, weight_std: float, output_std: float) -> None:
    """A YAML's init keys reach every weight, the learned position table included, with GPT-NeoX's
    formulas (docs/reference-format.md §4): scaled_normal N(0, std/sqrt(2L)), small_init
    N(0, sqrt(2/(5h))), wang_init N(0, 2/(L sqrt(h))); GPT-NeoX gives its position table init_method."""
    torch.manual_seed(0)
    shape = {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
             "max_position_embeddings": 512, "vocab_size": 512, "make_vocab_size_divisible_by": 8}
    state = build_model(load_config([], {**TINY, **shape, "pos_emb": "learned", "no_weight_tying": True, **keys})).state_dict()
    for key, expected in [
        ("embedding.word_embeddings.weight", weight_std),
        ("positional.position_embeddings.weight", weight_std),
        ("layers.1.attention.query_key_value.weight", weight_std),
        ("layers.2.mlp.dense_h_to_4h.weight", weight_std),
        ("lm_head.weight", weight_std),
        ("layers.0.attention.dense.weight", output_std),
        ("layers.3.mlp.dense_4h_to_h.weight", output_std),
    ]:
        assert state[key].std().item() == pytest.approx(expected, rel=0.03), key
        assert abs(state[key].mean().item()) < 0.05 * expected, key


def test_unknown_init_method_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown init method 'bogus'"):
        tiny_model("none", init_method="bogus")


def test_unsupported_reason_cases() -> None:
    assert "weight kernel" in unsupported_reason("sdpa", PositionKind.WEIGHT, "cuda", False)
    assert unsupported_reason("sdpa", "bias", "cpu", True) is None
    assert unsupported_reason("flex", PositionKind.WEIGHT, "cuda", True) is None
    assert unsupported_reason("flex", PositionKind.BIAS, "cpu", False) is None
    assert unsupported_reason("flex", PositionKind.BIAS, "cpu", True) == (
        "FlexAttention has no backward on CPU (it serves evaluation there); "
        "use attention_impl: eager or sdpa or auto"
    )
    # a weight kernel on a CPU: only eager trains it (flex, once suggested here, has no CPU backward)
    assert unsupported_reason("sdpa", PositionKind.WEIGHT, "cpu", True).endswith("use attention_impl: eager or auto")
    assert unsupported_reason("sdpa", PositionKind.WEIGHT, "cpu", False).endswith("eager or flex or auto")
    assert unsupported_reason("flex", PositionKind.WEIGHT, "cpu", True).endswith("use attention_impl: eager or auto")
    assert "unknown attention_impl 'fast'" in unsupported_reason("fast", PositionKind.NONE, "cpu", False)
    assert unsupported_reason("eager", PositionKind.WEIGHT, "cpu", True) is None


def test_model_refuses_unsupported_combinations() -> None:
    with pytest.raises(ValueError, match="weight kernel"):
        tiny_model("kerple_wht", impl="sdpa")
    with pytest.raises(ValueError, match="unknown attention_impl"):
        tiny_model("alibi").set_attention("fast")
    model = tiny_model("alibi", impl="flex").train()
    with pytest.raises(ValueError, match="no backward on CPU"):
        model(torch.randint(0, VOCAB, (1, 8)))


@pytest.mark.parametrize("name", positional.names())
def test_training_step_is_finite(name: str) -> None:
    tokens = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    for impl in [impl for impl in supported_impls(name) if impl != "flex"]:
        model = tiny_model(name, impl=impl, hidden_dropout=0.1, attention_dropout=0.1).train()
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("norm,activation", [("rmsnorm", "swish"), ("scalenorm", "relu")])
def test_other_norms_and_activations_run(norm: str, activation: str) -> None:
    model = tiny_model("alibi", norm=norm, activation=activation, layernorm_epsilon=1e-8)
    assert torch.isfinite(model(torch.randint(0, VOCAB, (1, 8)))).all()
