"""Plots are written, non-empty PNGs; effective lengths against hand-computed kernels."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from kerple.evaluation.plots import (
    bias_table,
    effective_lengths,
    heads_within,
    plot_effective_lengths,
    plot_kernels,
    plot_position_wise,
    plot_ppl_vs_length,
    positional_module,
)
from kerple.positional.base import ModelShape
from kerple.positional.kerple import KerpleLog

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000
    assert data[:8] == PNG_MAGIC


def kerple_log(r1: list[float], r2: list[float]) -> KerpleLog:
    module = KerpleLog(ModelShape(num_heads=len(r1), head_dim=8, hidden_size=8 * len(r1), max_positions=64))
    with torch.no_grad():
        module.bias_p.copy_(torch.tensor(r1).reshape(-1, 1, 1))
        module.bias_a.copy_(torch.tensor(r2).reshape(-1, 1, 1))
    return module


def test_effective_length_of_log_kernels_by_hand() -> None:
    # head 0: -1*log(1 + d) < -2  <=>  d > e^2 - 1 = 6.389  ->  eff = 7
    # head 1: -0.5*log(1 + 0.1 d) < -2  <=>  d > 10 (e^4 - 1) = 535.98  ->  eff = 536
    # head 2: -0.1*log(1 + 0.01 d) < -2  needs d > 100 (e^20 - 1), beyond 20480  ->  None
    table = bias_table(kerple_log([1.0, 0.5, 0.1], [1.0, 0.1, 0.01]))
    assert table.shape == (3, 20481)
    assert table[0, 7] == pytest.approx(-math.log(8), rel=1e-6)
    assert effective_lengths(table) == [7, 536, None]
    assert effective_lengths(table + 5.0) == [7, 536, None]  # softmax ignores a per-head constant
    counts = heads_within([7, 536, None], max_distance=1000)
    assert counts[6] == 0 and counts[7] == 1 and counts[535] == 1 and counts[536] == 2 and counts[1000] == 2


def test_positional_module_found_inside_a_model() -> None:
    inner = kerple_log([1.0], [1.0])
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), inner)
    assert positional_module(model) is inner
    with pytest.raises(ValueError, match="no positional embedding"):
        positional_module(torch.nn.Linear(2, 2))


def test_every_plot_writes_a_png(tmp_path: Path) -> None:
    lengths = [64, 128, 256, 512, 1024]
    written = [
        plot_ppl_vs_length(
            {"KERPLE (log)": (lengths, [9.0, 8.8, 8.7, 8.7, 8.8], [0.1] * 5), "Sinusoidal": (lengths, [9, 30, 200, 900, 3000], None)},
            tmp_path / "ppl.png",
            train_length=64,
        ),
        plot_position_wise(
            {"KERPLE (log)": list(np.linspace(3, 2, 256)), "windowed@64": [None] + list(np.linspace(3, 2.5, 255))},
            tmp_path / "sub" / "positions.png",
            smooth=8,
            train_length=64,
        ),
        plot_kernels(bias_table(kerple_log([1.0, 0.5], [1.0, 0.1]), 2000), tmp_path / "kernels.png"),
        plot_effective_lengths({"log": [7, 536, None], "alibi": [4, 8, 16]}, tmp_path / "eff.png"),
    ]
    for path in written:
        assert_png(path)
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def visible_y_labels(monkeypatch: pytest.MonkeyPatch, draw: Callable[[], object]) -> list[tuple[float, str]]:
    """(value, text) of every labelled y tick inside the view of the figure ``draw`` builds."""
    from kerple.evaluation import plots

    drawn = []

    def keep(fig: object, path: Path) -> Path:
        fig.canvas.draw()
        axes = fig.axes[0]
        low, high = axes.get_ylim()
        ticks = axes.yaxis.get_major_ticks() + axes.yaxis.get_minor_ticks()
        drawn.extend((t.get_loc(), t.label1.get_text()) for t in ticks if low <= t.get_loc() <= high and t.label1.get_text())
        return Path(path)

    monkeypatch.setattr(plots, "save_figure", keep)
    draw()
    return drawn


@pytest.mark.parametrize("means", [
    [3.40, 3.05, 2.86, 2.74, 2.71, 2.75],  # KERPLE (log) on GitHub, Table 3: within one decade, no 2x or 5x tick
    [6.07, 5.61, 5.22, 5.20, 5.01, 5.00],  # ArXiv
])
def test_a_perplexity_axis_within_a_decade_is_labelled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, means) -> None:
    lengths = [512, 1024, 2048, 4096, 8192, 16384]
    labels = visible_y_labels(monkeypatch, lambda: plot_ppl_vs_length({"log": (lengths, means, None)}, tmp_path / "p.png"))
    assert len(labels) >= 2  # two numbers at least, or the scale cannot be read
    for value, text in labels:
        assert float(text) == pytest.approx(value)


def test_a_perplexity_axis_over_decades_labels_one_two_and_five(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    curves = {"a": [math.log(v) for v in np.geomspace(1.2, 40, 256)]}
    labels = visible_y_labels(monkeypatch, lambda: plot_position_wise(curves, tmp_path / "p.png"))
    assert sorted(float(text) for _, text in labels) == [2, 5, 10, 20]
