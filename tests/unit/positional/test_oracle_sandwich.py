"""Oracles for Sandwich (thesis Eq. (4.6), §4.9.5) and smoothed Sandwich (§4.6.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dense_views import dense_bias
import kerple.positional as positional


def sandwich_by_hand(d: int, head: int, heads: int, bar_d: int = 128) -> float:
    """(Σ_{i=0}^{d̄/2-1} cos(d / 10000^(2i/d̄)) - d̄/2) / (n·8/H), n = head + 1."""
    total = sum(math.cos(d / 10000 ** (2 * i / bar_d)) for i in range(bar_d // 2))
    return (total - bar_d / 2) / ((head + 1) * 8 / heads)


@pytest.mark.parametrize("heads,bar_d", [(4, 128), (12, 128), (3, 64)])
def test_sandwich_matches_formula(heads: int, bar_d: int) -> None:
    module = positional.build("sandwich", num_heads=heads, head_dim=8, hidden_size=8 * heads, max_positions=16, sandwich_dim=bar_d)
    q_len, k_len = 3, 700
    bias = dense_bias(module, q_len, k_len)
    for h in range(heads):
        for row in range(q_len):
            i = k_len - q_len + row
            for j in list(range(0, i + 1, 37)) + [i, i - 1]:
                assert bias[h, row, j].item() == pytest.approx(sandwich_by_hand(i - j, h, heads, bar_d), rel=1e-5, abs=1e-5)


def test_sandwich_matches_thesis_numpy_reference() -> None:
    """§4.9.5: pos_embs @ pos_embs.T / ratio equals our bias up to the per-head constant d̄/(2h)."""
    heads, seq_len, bar_d, base = 12, 300, 128, 1e4
    positions = np.arange(seq_len)[..., None]
    i = np.arange(bar_d // 2)
    pos_embs = np.concatenate(
        [np.sin(positions / base ** (2 * i / bar_d)), np.cos(positions / base ** (2 * i / bar_d))], axis=-1
    )
    ratio = np.arange(1, heads + 1) * 8 / heads
    reference = (pos_embs @ pos_embs.T)[None] / ratio[:, None, None] - (bar_d / 2) / ratio[:, None, None]
    module = positional.build("sandwich", num_heads=heads, head_dim=8, hidden_size=96, max_positions=16)
    ours = dense_bias(module, seq_len, seq_len).double().numpy()
    lower = np.tril(np.ones((seq_len, seq_len), dtype=bool))
    assert np.allclose(ours[:, lower], reference[:, lower], atol=2e-5)


def test_sandwich_tensor_parallel_slice() -> None:
    module = positional.build("sandwich", num_heads=2, head_dim=8, hidden_size=16, max_positions=16, head_offset=6, total_heads=8)
    table, _ = module.distance_tables(40)
    for local, global_head in enumerate((6, 7)):
        assert table[local, 39].item() == pytest.approx(sandwich_by_hand(39, global_head, 8), rel=1e-5)


@pytest.mark.parametrize("heads", [1, 4, 12])
def test_smoothed_sandwich_matches_polyfit(heads: int) -> None:
    module = positional.build("sandwich_smoothed", num_heads=heads, head_dim=8, hidden_size=8 * heads, max_positions=16)
    table, scale = module.distance_tables(3000)
    assert scale is None
    distances = np.arange(50)
    for h in range(heads):
        target = np.array([sandwich_by_hand(int(d), h, heads) for d in distances])
        slope, intercept = np.polyfit(np.log1p(distances), target, 1)
        design = np.stack([-np.log1p(distances), np.ones(50)], axis=1)
        (alpha, beta), *_ = np.linalg.lstsq(design, target, rcond=None)
        assert alpha == pytest.approx(-slope, rel=1e-9) and beta == pytest.approx(intercept, rel=1e-9)
        for d in (0, 1, 7, 49, 50, 511, 2999):
            assert table[h, d].item() == pytest.approx(-alpha * math.log1p(d) + beta, rel=1e-5, abs=1e-5)


def test_smoothed_sandwich_h8_fit_is_log_shaped() -> None:
    """For h = 8 (H = 1) the 50-point fit is close to a unit log slope (cf. thesis §4.6.3)."""
    module = positional.build("sandwich_smoothed", num_heads=1, head_dim=8, hidden_size=8, max_positions=16)
    assert float(module.alpha[0]) == pytest.approx(1.0245, abs=1e-3)
    assert float(module.beta[0]) == pytest.approx(-0.0151, abs=1e-3)
