"""Softmax temperature τ (thesis §5.4, Algorithm 1): ``softmax((q·kᵀ/√d + b) / τ)`` in every kernel."""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.model.model_helpers import HEADS, HEAD_DIM, VOCAB, supported_impls, tiny_model

TOKENS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", ["alibi", "kerple_log", "rotary", "none"])
def test_temperature_one_leaves_the_model_unchanged(name: str) -> None:
    model = tiny_model(name).eval()
    with torch.no_grad():
        before = model(TOKENS)
        model.set_temperature(1.0)
        after = model(TOKENS)
    assert torch.equal(before, after)


@pytest.mark.parametrize(
    "name", ["alibi", "kerple_log", "kerple_power", "rotary", "kerple_wht", "none", "fire", "cable", "xpos"]
)
def test_kernels_agree_with_a_temperature(name: str) -> None:
    outputs = {}
    for impl in supported_impls(name):
        model = tiny_model(name, impl=impl, window=10, init_method_std=0.3).eval()  # sharp enough for τ to matter
        model.set_temperature(0.6)
        with torch.no_grad():
            outputs[impl] = model(TOKENS)
    reference = outputs.pop("eager")
    for impl, output in outputs.items():
        torch.testing.assert_close(output, reference, atol=1e-5, rtol=1e-5, msg=impl)
    with torch.no_grad():
        plain = tiny_model(name, window=10, init_method_std=0.3).eval()(TOKENS)
    assert not torch.allclose(plain, reference, atol=1e-3)  # τ really changed the function


def test_hand_computed_softmax_with_alibi_bias() -> None:
    """Layer 0 of an ALiBi model against ``softmax((q·kᵀ/√d - m_h·(i-j)) / τ) v`` written here."""
    tau = 0.5
    model = tiny_model("alibi").eval()
    model.set_temperature(tau)
    seen = {}
    attention = model.layers[0].attention
    attention.register_forward_pre_hook(lambda _m, inputs: seen.update(x=inputs[0]))
    attention.register_forward_hook(lambda _m, _i, output: seen.update(out=output))
    with torch.no_grad():
        model(TOKENS[:1])
        x = seen["x"][0]  # [s, h]
        qkv = x @ attention.query_key_value.weight.T + attention.query_key_value.bias
        seq = x.shape[0]
        distance = torch.arange(seq)[:, None] - torch.arange(seq)[None, :]
        heads = []
        for h in range(HEADS):
            block = qkv[:, h * 3 * HEAD_DIM : (h + 1) * 3 * HEAD_DIM]
            q, k, v = block[:, :HEAD_DIM], block[:, HEAD_DIM : 2 * HEAD_DIM], block[:, 2 * HEAD_DIM :]
            slope = 2.0 ** (-8.0 * (h + 1) / HEADS)  # Press et al.: 2^(-8n/H) for H a power of two
            logits = (q @ k.T / math.sqrt(HEAD_DIM) - slope * distance) / tau
            logits = logits.masked_fill(distance < 0, -1e30)
            heads.append(torch.softmax(logits, -1) @ v)
        expected = torch.cat(heads, -1) @ attention.dense.weight.T + attention.dense.bias
    torch.testing.assert_close(seen["out"][0], expected, atol=1e-5, rtol=1e-5)


def test_temperature_must_be_positive() -> None:
    model = tiny_model("alibi")
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match="temperature"):
            model.set_temperature(bad)
