"""Algorithm 1 (thesis §5.4) on logits whose answer is known."""

from __future__ import annotations

import pytest
import torch

from kerple.analysis.align_temperature import GRID, align, closest_temperature, describe, plot_alignment
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


def test_a_target_beyond_the_grid_is_not_called_aligned() -> None:
    """Entropy that even τ = 0.5 cannot lower to the train-length target: τ = 0.5 is the grid's end, not an answer."""
    def statistic(which: str, tau: float) -> float:
        return 3.0 if which == "train" else 3.0 + tau  # S_ex(τ) in [3.5, 4.0], all above the target

    result = align(statistic)
    assert result["temperature"] == 0.5 and result["reached"] is False
    assert result["gap"] == pytest.approx(0.5)
    line = describe("entropy", result, 64, 512)
    assert "3.5000 nats" in line and "not aligned" in line
    inside = align(lambda which, tau: 0.2 if which == "train" else 0.1 / tau)  # 0.2 at τ = 0.5
    assert inside["reached"] is True and inside["temperature"] == 0.5 and "not aligned" not in describe(
        "pmax", inside, 64, 512)


def test_the_plot_marks_the_log_baseline_and_an_unreached_target() -> None:
    result = align(lambda which, tau: 3.0 if which == "train" else 3.0 + tau)
    figure = plot_alignment({"entropy": result}, "title", log_baseline=0.667)
    labels = figure.axes[0].get_legend_handles_labels()[1]
    assert "log_L_ex(L_tr) = 0.667" in labels
    assert "chosen τ = 0.5 (grid's end, not aligned)" in labels
    assert figure.axes[0].get_xlabel() == "softmax temperature τ"
