"""Attention sharpness (thesis Table 5.1) against uniform attention and a hand-computed softmax."""

from __future__ import annotations

import math

import pytest
import torch

from kerple import positional
from kerple.analysis.attention_stats import attention_statistics
from kerple.model import GPTModel
from kerple.checkpoint import NeoxAdapter
from tests.unit.model.model_helpers import (
    HEADS, HEAD_DIM, HIDDEN, VOCAB, cable_reference_bias, fire_reference_bias, tiny_model,
)


def one_layer_model(name: str, window: int | None = None) -> GPTModel:
    torch.manual_seed(0)
    pe = positional.build(name, num_heads=HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN, max_positions=128)
    return GPTModel(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, padded_vocab_size=VOCAB,
                    positional=pe, attention_window=window, flex_compile=False).eval()


@pytest.mark.parametrize("name, window", [("none", None), ("rotary", None), ("none", 6)])
def test_zero_query_key_weights_give_uniform_attention(name: str, window: int | None) -> None:
    """q = k = 0: every visible key gets 1/n, so P_max = 1/n and H = log n with n visible keys."""
    model = one_layer_model(name, window)
    qkv = model.layers[0].attention.query_key_value
    with torch.no_grad():
        for head in range(HEADS):  # rows are interleaved per head: q, k, v of head 0, then head 1, ...
            rows = slice(head * 3 * HEAD_DIM, head * 3 * HEAD_DIM + 2 * HEAD_DIM)
            qkv.weight[rows] = 0.0
            qkv.bias[rows] = 0.0
    length = 20
    visible = [min(i + 1, window or length) for i in range(length)]
    stats = attention_statistics(model, torch.randint(0, VOCAB, (3, length)), temperature=0.6, block_rows=7,
                                 progress=False)
    expected_pmax = sum(1 / n for n in visible) / length
    expected_entropy = sum(math.log(n) for n in visible) / length
    for head in range(HEADS):
        assert stats["pmax"][0][head] == pytest.approx(expected_pmax, rel=1e-5)
        assert stats["entropy"][0][head] == pytest.approx(expected_entropy, rel=1e-5)


def test_statistics_match_a_hand_computed_softmax() -> None:
    """Layer 0 of an ALiBi model with a window and τ = 0.7, rows rebuilt here from the reference math."""
    tau, window, length = 0.7, 9, 24
    model = tiny_model("alibi", window=window, init_method_std=0.3).eval()
    tokens = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(4))
    seen = {}
    attention = model.layers[0].attention
    handle = attention.register_forward_pre_hook(lambda _m, inputs: seen.update(x=inputs[0]))
    stats = attention_statistics(model, tokens, temperature=tau, block_rows=5, progress=False)
    handle.remove()
    x = seen["x"].detach()
    with torch.no_grad():
        qkv = x @ attention.query_key_value.weight.T + attention.query_key_value.bias  # [b, s, 3h]
    distance = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    visible = (distance >= 0) & (distance < window)
    for head in range(HEADS):
        block = qkv[..., head * 3 * HEAD_DIM : (head + 1) * 3 * HEAD_DIM]
        q, k = block[..., :HEAD_DIM], block[..., HEAD_DIM : 2 * HEAD_DIM]
        slope = 2.0 ** (-8.0 * (head + 1) / HEADS)
        logits = (q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) - slope * distance) / tau
        probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
        assert stats["pmax"][0][head] == pytest.approx(float(probs.max(-1).values.mean()), rel=1e-5)
        assert stats["entropy"][0][head] == pytest.approx(float(entropy.mean()), rel=1e-5)
    assert model.softmax_temperature == 1.0  # restored after the measurement


@pytest.mark.parametrize("name", ["fire", "cable"])
def test_statistics_include_a_term_without_distance_tables(name: str) -> None:
    """FIRE's and CABLE's terms (no distance tables; CABLE's from each layer's input) enter the
    logits of layer 1 as in the model, with τ = 0.8."""
    tau, length = 0.8, 16
    model = tiny_model(name, init_method_std=0.3).eval()
    with torch.no_grad():
        for param in model.positional.parameters():
            param.mul_(3.0)  # a term large enough to matter
    reference = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    state = {key: value.detach() for key, value in reference.items()}
    tokens = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(5))
    seen = {}
    attention = model.layers[1].attention
    handle = attention.register_forward_pre_hook(lambda _m, inputs: seen.update(x=inputs[0]))
    stats = attention_statistics(model, tokens, temperature=tau, block_rows=5, progress=False)
    handle.remove()
    x = seen["x"].detach()
    term = fire_reference_bias(state, length) if name == "fire" else cable_reference_bias(state)(1, x)
    with torch.no_grad():
        qkv = x @ attention.query_key_value.weight.T + attention.query_key_value.bias  # [b, s, 3h]
    causal = torch.tril(torch.ones(length, length)).bool()
    for head in range(HEADS):
        block = qkv[..., head * 3 * HEAD_DIM : (head + 1) * 3 * HEAD_DIM]
        q, k = block[..., :HEAD_DIM], block[..., HEAD_DIM : 2 * HEAD_DIM]
        logits = (q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) + term[..., head, :, :]) / tau
        probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
        assert stats["pmax"][1][head] == pytest.approx(float(probs.max(-1).values.mean()), rel=1e-5)


def test_uniform_reference_by_hand() -> None:
    """Causal rows 1..4 keys: P_max 1, 1/2, 1/3, 1/4 and H = ln n; a window of 2 caps n at 2."""
    from kerple.analysis.attention_stats import uniform_statistics

    assert uniform_statistics(4) == pytest.approx(((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4,
                                                   (math.log(2) + math.log(3) + math.log(4)) / 4))
    assert uniform_statistics(4, window=2) == pytest.approx(((1 + 3 / 2) / 4, 3 * math.log(2) / 4))


def test_plot_names_the_units() -> None:
    from kerple.analysis.attention_stats import plot_statistics

    rows = [{"length": n, "pmax": [[0.5, 0.4]], "entropy": [[1.0, 1.2]]} for n in (8, 32)]
    figure = plot_statistics(rows, "Attention sharpness (alibi, τ = log)")
    assert figure.axes[0].get_xlabel() == "length (tokens)" and figure.axes[1].get_ylabel() == "mean entropy (nats)"
