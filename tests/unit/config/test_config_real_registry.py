"""Config validation against the real positional registry and attention implementations."""

from __future__ import annotations

import pytest
import torch

from kerple.config import ConfigError, load_config

pytest.importorskip("kerple.positional")
pytest.importorskip("kerple.model.attention")


@pytest.mark.parametrize(
    ("written", "canonical"),
    [("t5", "rpe"), ("kerple_power_ap_", "kerple_power"), ("kerple_power_ap_ap", "kerple_bias_wht"), ("alibi", "alibi")],
)
def test_reference_spellings_are_stored_canonically(write, written, canonical):
    assert load_config([write("pe.yml", f"pos-emb: {written}\n")]).positional.pos_emb == canonical


def test_unknown_name_is_refused_by_the_registry(write):
    with pytest.raises(ConfigError, match="kerple_log"):
        load_config([write("pe.yml", "pos-emb: kerple-log\n")])


def test_sdpa_cannot_serve_a_weight_kernel(write):
    path = write("w.yml", "pos_emb: kerple_power__ap\nattention_impl: sdpa\n")
    with pytest.raises(ConfigError) as info:
        load_config([path])
    assert path in str(info.value) and "attention_impl" in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="flex training is allowed on CUDA")
def test_flex_training_refused_on_cpu_but_evaluation_allowed(write):
    with pytest.raises(ConfigError, match="flex"):
        load_config([write("f.yml", "pos_emb: kerple_log\nattention_impl: flex\n")])
    cfg = load_config([write("e.yml", "pos_emb: kerple_log\nattention_impl: flex\ntrain-iters: 0\n")])
    assert cfg.attention.attention_impl == "flex"


def test_learned_embedding_eval_limit(write):
    cfg = load_config([write("l.yml", "pos_emb: learned\nseq_length: 512\n")])
    cfg.check_eval_length(512)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        cfg.check_eval_length(513)
    load_config([write("s.yml", "pos_emb: sinusoidal\nseq_length: 512\n")]).check_eval_length(4096)
