"""Algorithm 1 (thesis §5.4) on logits whose answer is known."""

from __future__ import annotations

import pytest
import torch

from kerple.analysis.align_temperature import GRID, align, closest_temperature
from kerple.analysis.attention_stats import row_statistics


def test_grid_is_the_thesis_grid() -> None:
    assert GRID == (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5)


@pytest.mark.parametrize("mode", ["pmax", "entropy"])
@pytest.mark.parametrize("answer", [0.7, 0.55, 1.0])
def test_search_recovers_a_known_temperature(mode: str, answer: float) -> None:
    """Extrapolation logits = ``answer`` x train logits: softmax(l_ex / answer) = softmax(l_tr) row by row."""
    train = torch.randn(500, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    extrapolation = train * answer

    def statistic(which: str, tau: float) -> float:
        logits = (train if which == "train" else extrapolation) / tau
        pmax, entropy = row_statistics(torch.softmax(logits, dim=-1))
        return float((pmax if mode == "pmax" else entropy).mean())

    result = align(statistic)
    assert result["temperature"] == answer
    assert result["grid"][f"{answer:g}"] == pytest.approx(result["target"])


def test_closest_temperature_by_hand() -> None:
    assert closest_temperature(0.30, {1.0: 0.1, 0.9: 0.2, 0.8: 0.28, 0.7: 0.35}) == 0.8
    assert closest_temperature(0.25, {1.0: 0.2, 0.9: 0.3}) == 1.0  # a tie keeps the larger τ
