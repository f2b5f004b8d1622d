"""Oracles for ALiBi (exact slopes, thesis Table 4.1 options), kerple_power_original and T5 buckets."""

from __future__ import annotations

import math

import pytest
import torch

from dense_views import dense_bias
import kerple.positional as positional

# Hand-written slope lists (docs/reference-format.md §3).
SLOPES_8 = [2.0**-k for k in range(1, 9)]
SLOPES_12 = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
SLOPES_16 = [2.0**-(k / 2) for k in range(1, 17)]
SLOPES_6 = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


def build(name: str, heads: int, **options: object) -> positional.PositionalEmbedding:
    return positional.build(name, num_heads=heads, head_dim=8, hidden_size=8 * heads, max_positions=16, **options)


def assert_linear_bias(module: positional.PositionalEmbedding, slopes: list[float], q_len: int = 3, k_len: int = 9) -> None:
    bias = dense_bias(module, q_len, k_len)
    for h, slope in enumerate(slopes):
        for row in range(q_len):
            i = k_len - q_len + row
            for j in range(i + 1):
                assert bias[h, row, j].item() == pytest.approx(-slope * (i - j), rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("heads,slopes", [(8, SLOPES_8), (12, SLOPES_12), (16, SLOPES_16), (6, SLOPES_6)])
def test_alibi_exact_slopes(heads: int, slopes: list[float]) -> None:
    module = build("alibi", heads)
    assert module.slopes.tolist() == pytest.approx(slopes, rel=1e-7)
    assert_linear_bias(module, slopes)


@pytest.mark.parametrize("shift", [-3, 2, 8])
def test_alibi_slope_shift(shift: int) -> None:
    """Thesis Table 4.1 'shift all h by Δ': slope 1/2^(h+Δ)."""
    assert build("alibi", 8, alibi_slope_shift=shift).slopes.tolist() == pytest.approx(
        [2.0 ** -(n + shift) for n in range(1, 9)], rel=1e-7
    )
    # H = 12: the same exponent shift applied to the interleaved exponents
    shifted = build("alibi", 12, alibi_slope_shift=shift)
    assert shifted.slopes.tolist() == pytest.approx([s * 2.0**-shift for s in SLOPES_12], rel=1e-7)
    assert_linear_bias(shifted, [s * 2.0**-shift for s in SLOPES_12])


@pytest.mark.parametrize("h", [0, 2, 6])
def test_alibi_equal_slope(h: int) -> None:
    module = build("alibi", 12, alibi_equal_slope=h)
    assert module.slopes.tolist() == [2.0**-h] * 12
    with pytest.raises(ValueError):
        build("alibi", 12, alibi_equal_slope=h, alibi_slope_shift=1)


def test_alibi_tensor_parallel_slice_uses_global_heads() -> None:
    module = build("alibi", 4, head_offset=4, total_heads=12)
    assert module.slopes.tolist() == pytest.approx(SLOPES_12[4:8])
    module = build("alibi", 6, head_offset=6, total_heads=12)
    assert module.slopes.tolist() == pytest.approx(SLOPES_12[6:])
    with pytest.raises(ValueError):
        build("alibi", 6, head_offset=8, total_heads=12)


@pytest.mark.parametrize("heads,slopes", [(8, SLOPES_8), (12, SLOPES_12)])
def test_kerple_power_original_is_alibi_with_reference_clamp(heads: int, slopes: list[float]) -> None:
    """Reference: frozen bias_a = ALiBi slopes, clamped to >= 0.01 before -bias_a * d."""
    module = build("kerple_power_original", heads)
    assert module.bias_a.flatten().tolist() == pytest.approx(slopes)
    assert list(module.parameters()) == []
    assert_linear_bias(module, [max(s, 0.01) for s in slopes])


def t5_bucket_by_hand(d: int) -> int:
    if d < 16:
        return d
    return min(31, 16 + math.floor(math.log(d / 16) / math.log(128 / 16) * 16))


def test_t5_buckets_distances_0_to_2000() -> None:
    heads, head_dim = 3, 16
    module = positional.build("t5", num_heads=heads, head_dim=head_dim, hidden_size=48, max_positions=16)
    assert tuple(module.weight.shape) == (32, heads)
    with torch.no_grad():
        for bucket in range(32):
            for h in range(heads):
                module.weight[bucket, h] = 100 * h + bucket
    k_len = 2001
    last_row = dense_bias(module, 1, k_len)[:, 0, :]  # query at position 2000: distance 2000 - j
    scale = math.sqrt(head_dim)
    for d in range(k_len):
        for h in range(heads):
            expected = (100 * h + t5_bucket_by_hand(d)) * scale
            assert last_row[h, k_len - 1 - d].item() == pytest.approx(expected, rel=1e-6), (d, h)


def test_t5_bucket_spot_values() -> None:
    """A few values worked out by hand: log(d/16)/log(8)*16 = 16*log2(d/16)/3."""
    spots = {0: 0, 15: 15, 16: 16, 17: 16, 20: 17, 32: 21, 64: 26, 100: 30, 127: 31, 128: 31, 5000: 31}
    module = positional.build("rpe", num_heads=1, head_dim=4, hidden_size=4, max_positions=16)
    with torch.no_grad():
        module.weight.copy_(torch.arange(32, dtype=torch.float32)[:, None])
    table, _ = module.distance_tables(5001)
    for d, bucket in spots.items():
        assert table[0, d].item() == pytest.approx(bucket * 2.0)


def test_t5_xavier_normal_init() -> None:
    torch.manual_seed(0)
    module = positional.build("rpe", num_heads=480, head_dim=4, hidden_size=1920, max_positions=16)
    expected_std = math.sqrt(2.0 / (32 + 480))
    assert module.weight.std().item() == pytest.approx(expected_std, rel=0.03)


def test_alibi_slopes_equal_bloom_for_1_to_32_heads() -> None:
    """Hugging Face's BLOOM ALiBi (``build_alibi_tensor``: slope · key position, Press et al.'s slopes, the
    interleaved extra slopes for a head count that is not a power of two) gives every head's slope."""
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    for heads in range(1, 33):
        alibi = bloom.build_alibi_tensor(torch.ones(1, 4), heads, torch.float32).reshape(heads, 4)
        module = build("alibi", heads)
        assert module.slopes.float().tolist() == pytest.approx(alibi[:, 1].tolist(), rel=1e-6), heads


def test_t5_buckets_equal_huggingface_t5_decoder() -> None:
    """Hugging Face's T5 decoder buckets (``_relative_position_bucket``, unidirectional, 32 buckets, max distance
    128) at every distance 0-4999, through the bias table with bucket b holding b (times √head_dim)."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    distances = torch.arange(5000)
    expected = t5.T5Attention._relative_position_bucket(-distances, bidirectional=False, num_buckets=32,
                                                        max_distance=128)
    module = positional.build("rpe", num_heads=1, head_dim=4, hidden_size=4, max_positions=16)
    with torch.no_grad():
        module.weight.copy_(torch.arange(32, dtype=torch.float32)[:, None])
    table, _ = module.distance_tables(5000)
    assert torch.equal((table[0] / math.sqrt(4)).round().long(), expected)
