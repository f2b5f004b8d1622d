"""Oracles for the input and query/key embeddings: learned, sinusoidal, rotary.

Formulas restated with plain Python loops (docs/reference-format.md §3); rotary also against HF GPTNeoX.
"""

from __future__ import annotations

import math

import pytest
import torch

import kerple.positional as positional


def test_learned_adds_its_table_rows() -> None:
    module = positional.build("learned", num_heads=2, head_dim=4, hidden_size=8, max_positions=10)
    weight = module.position_embeddings.weight
    assert tuple(weight.shape) == (10, 8)
    with torch.no_grad():
        for row in range(10):
            for col in range(8):
                weight[row, col] = row * 100 + col
    hidden = torch.randn(2, 3, 8)
    positions = torch.tensor([7, 8, 9])
    out = module.embed(hidden, positions)
    for b in range(2):
        for s, pos in enumerate([7, 8, 9]):
            for col in range(8):
                assert out[b, s, col].item() == pytest.approx(hidden[b, s, col].item() + pos * 100 + col)
    with pytest.raises(ValueError):
        module.embed(hidden, torch.tensor([8, 9, 10]))


def test_learned_init_is_normal_002() -> None:
    torch.manual_seed(0)
    module = positional.build("learned", num_heads=2, head_dim=4, hidden_size=256, max_positions=512)
    std = module.position_embeddings.weight.std().item()
    assert abs(std - 0.02) < 0.001
    assert abs(module.position_embeddings.weight.mean().item()) < 0.001


def test_sinusoidal_matches_formula() -> None:
    hidden_size = 10
    module = positional.build("sinusoidal", num_heads=2, head_dim=5, hidden_size=hidden_size, max_positions=8)
    positions = [0, 1, 5, 1000, 4096]
    hidden = torch.zeros(1, len(positions), hidden_size)
    out = module.embed(hidden, torch.tensor(positions))
    half = hidden_size // 2
    for s, t in enumerate(positions):
        for k in range(half):
            inv_freq = 1.0 / 10000 ** (2 * k / hidden_size)
            assert out[0, s, k].item() == pytest.approx(math.sin(t * inv_freq), abs=2e-4)
            assert out[0, s, half + k].item() == pytest.approx(math.cos(t * inv_freq), abs=2e-4)


def rotary_by_hand(x: list[float], position: int, rotary_ndims: int, base: float) -> list[float]:
    """Rotate one head vector: channel c pairs with c + r/2 at angle t / base^(2c/r)."""
    half = rotary_ndims // 2
    out = list(x)
    for c in range(half):
        angle = position / base ** (2 * c / rotary_ndims)
        first, second = x[c], x[c + half]
        out[c] = first * math.cos(angle) - second * math.sin(angle)
        out[c + half] = second * math.cos(angle) + first * math.sin(angle)
    return out


@pytest.mark.parametrize("rotary_pct,base", [(1.0, 10000.0), (0.5, 10000.0), (0.25, 500.0)])
def test_rotary_matches_hand_formula(rotary_pct: float, base: float) -> None:
    head_dim, heads = 16, 2
    module = positional.build(
        "rotary", num_heads=heads, head_dim=head_dim, hidden_size=32, max_positions=8,
        rotary_pct=rotary_pct, rotary_emb_base=base,
    )
    rotary_ndims = int(head_dim * rotary_pct)
    torch.manual_seed(0)
    query, key = torch.randn(1, heads, 4, head_dim), torch.randn(1, heads, 4, head_dim)
    q_positions, k_positions = torch.tensor([3, 4, 5, 6]), torch.tensor([0, 1, 200, 2047])
    out_q, out_k = module.rotate(query, key, q_positions, k_positions)
    for source, out, positions in ((query, out_q, q_positions), (key, out_k, k_positions)):
        for h in range(heads):
            for s in range(4):
                expected = rotary_by_hand(source[0, h, s].tolist(), int(positions[s]), rotary_ndims, base)
                assert out[0, h, s].tolist() == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("rotary_pct,base", [(1.0, 10000.0), (0.25, 500.0)])
def test_rotary_matches_huggingface_gpt_neox(rotary_pct: float, base: float) -> None:
    modeling = pytest.importorskip("transformers.models.gpt_neox.modeling_gpt_neox")
    transformers = pytest.importorskip("transformers")
    heads, head_dim = 4, 16
    config = transformers.GPTNeoXConfig(
        hidden_size=heads * head_dim, num_attention_heads=heads, intermediate_size=64, num_hidden_layers=1,
        rotary_pct=rotary_pct, rotary_emb_base=base,
    )
    try:
        hf_rotary = modeling.GPTNeoXRotaryEmbedding(config)
    except Exception as error:  # API drift between transformers versions
        pytest.skip(f"GPTNeoXRotaryEmbedding unavailable: {error}")
    torch.manual_seed(1)
    query, key = torch.randn(2, heads, 7, head_dim), torch.randn(2, heads, 7, head_dim)
    positions = torch.arange(7) + 100
    cos, sin = hf_rotary(query, positions[None])
    expected_q, expected_k = modeling.apply_rotary_pos_emb(query, key, cos, sin)
    module = positional.build(
        "rotary", num_heads=heads, head_dim=head_dim, hidden_size=heads * head_dim, max_positions=8,
        rotary_pct=rotary_pct, rotary_emb_base=base,
    )
    ours_q, ours_k = module.rotate(query, key, positions, positions)
    assert torch.allclose(ours_q, expected_q, atol=1e-5)
    assert torch.allclose(ours_k, expected_k, atol=1e-5)


def test_rotary_inv_freq_buffer() -> None:
    module = positional.build("rotary", num_heads=2, head_dim=8, hidden_size=16, max_positions=8)
    expected = [1.0 / 10000 ** (c / 8) for c in (0, 2, 4, 6)]
    assert module.inv_freq.tolist() == pytest.approx(expected, rel=1e-6)
    assert module.state_dict_name == "rotary_emb"
