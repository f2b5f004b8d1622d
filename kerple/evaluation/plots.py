"""Figures of the KERPLE paper, written as PNG files with matplotlib's Agg backend.

* :func:`plot_ppl_vs_length` — perplexity against evaluation length, one line per embedding
  (the numbers of Table 3, §5.2), log y-axis.
* :func:`plot_position_wise` — position-wise perplexity (§5.5, Fig. 5; Appendix A.6, Fig. 7), with
  the curve of the same model evaluated with windowed attention for comparison.
* :func:`plot_kernels` — the learned bias kernel of every head against distance up to 20480
  (§5.4, Figs. 2-4).
* :func:`plot_effective_lengths` — the number of heads whose effective length is at most ``|m-n|``
  (Appendix A.5, Fig. 6), with :func:`effective_lengths` computing each head's
  ``eff = min{d : bias(d) < -2}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from kerple.atomic import atomic_path  # noqa: E402
from kerple.positional.base import PositionalEmbedding  # noqa: E402

KERNEL_MAX_DISTANCE = 20480  # Figs. 2-4 and 6 span |m - n| in [0, 20480]
EFFECTIVE_LENGTH_THRESHOLD = -2.0  # Appendix A.5: a bias of -2 or less strongly attenuates softmax


def save_figure(fig: plt.Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write the figure as PNG atomically (:func:`kerple.atomic.atomic_path`; no half-written PNGs), close it."""
    path = Path(path)
    try:
        with atomic_path(path, suffix=".png") as temporary:
            fig.savefig(temporary, dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def plot_ppl_vs_length(
    series: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[float] | None]],
    path: str | Path,
    *,
    title: str = "Perplexity vs evaluation length",
    train_length: int | None = None,
) -> Path:
    """One line per embedding: ``name -> (lengths, mean ppl, std ppl or None)``; log-log axes."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    cycle = len(plt.rcParams["axes.prop_cycle"])
    for index, (name, (lengths, means, stds)) in enumerate(series.items()):
        repeated = index >= cycle  # the colours repeat: a dashed line and square markers tell them apart
        line = ax.plot(lengths, means, marker="s" if repeated else "o", linestyle="--" if repeated else "-",
                       label=name)[0]
        if stds is not None and any(s > 0 for s in stds):
            low = np.asarray(means) - np.asarray(stds)
            high = np.asarray(means) + np.asarray(stds)
            ax.fill_between(lengths, np.maximum(low, 1e-3), high, color=line.get_color(), alpha=0.15)
    if train_length:
        ax.axvline(train_length, color="grey", linestyle=":", label=f"train length {train_length}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    _plain_log_axis(ax.yaxis)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _plain_log_axis(axis: Axis) -> None:
    """Label a log axis with plain numbers (``200``, ``5000``): every decade, and 2x and 5x within it;
    every tick when the view spans less than a decade, which may hold no decade, 2x or 5x value
    (perplexities from 2.7 to 3.4, as on GitHub in Table 3)."""

    def minor(value: float, _: object) -> str:
        if value <= 0:
            return ""
        low, high = sorted(axis.get_view_interval())
        if low > 0 and high / low < 10:
            return f"{value:g}"
        mantissa = value / 10 ** math.floor(math.log10(value))
        return f"{value:g}" if any(math.isclose(mantissa, m) for m in (2, 5)) else ""

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _moving_average(values: np.ndarray, width: int) -> np.ndarray:
    if width <= 1:
        return values
    kernel = np.ones(width) / width
    padded = np.concatenate([np.full(width - 1, values[0]), values])
    return np.convolve(padded, kernel, mode="valid")


def plot_position_wise(
    curves: Mapping[str, Sequence[float]],
    path: str | Path,
    *,
    title: str = "Position-wise perplexity",
    smooth: int = 1,
    train_length: int | None = None,
) -> Path:
    """Position-wise perplexity, ``exp`` of the mean loss at each position (§5.5, Figs. 5 and 7).

    ``curves`` maps a label (e.g. ``"KERPLE (log)"`` and ``"KERPLE (log) windowed@512"``) to the
    per-position mean losses written by ``evaluate.py --per-position``. ``smooth`` averages the
    losses over a trailing window of that many positions before exponentiating.
    """
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, losses in curves.items():
        values = np.asarray([math.nan if v is None else v for v in losses], dtype=np.float64)
        valid = ~np.isnan(values)
        positions = np.arange(values.size)[valid]
        ax.plot(positions, np.exp(_moving_average(values[valid], smooth)), label=name, linewidth=1.2)
    if train_length:
        ax.axvline(train_length, color="grey", linestyle=":", label=f"train length {train_length}")
    ax.set_yscale("log")
    _plain_log_axis(ax.yaxis)
    ax.set_xlabel("position")
    ax.set_ylabel("perplexity" + (f" (moving average over {smooth})" if smooth > 1 else ""))
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def positional_module(model: nn.Module) -> PositionalEmbedding:
    """The model's (single, shared) positional embedding module."""
    for module in model.modules():
        if isinstance(module, PositionalEmbedding):
            return module
    raise ValueError("the model has no positional embedding module")


@torch.no_grad()
def bias_table(embedding: PositionalEmbedding, max_distance: int = KERNEL_MAX_DISTANCE) -> np.ndarray | None:
    """Per-head additive bias against distance ``0..max_distance``, float64 ``[H, max_distance + 1]``.

    ``None`` when the embedding adds no bias to the logits (rotary, sinusoidal, ...).
    """
    table, _ = embedding.distance_tables(max_distance + 1, device=torch.device("cpu"))
    return None if table is None else table.detach().double().cpu().numpy()


def plot_kernels(table: np.ndarray, path: str | Path, *, title: str = "Learned kernels") -> Path:
    """The bias kernel ``k(0, |m - n|)`` of every head against ``|m - n|`` (§5.4, Figs. 2-4)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    distances = np.arange(table.shape[1])
    for head, row in enumerate(table):
        ax.plot(distances, row, label=f"head {head}", linewidth=1.0)
    ax.set_xscale("symlog", linthresh=1)  # near distances and 20480 both readable
    ax.set_xlabel("|m - n|")
    ax.set_ylabel("bias added to the attention logit")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if table.shape[0] > 6 else 1)
    return save_figure(fig, path)


def effective_lengths(table: np.ndarray, threshold: float = EFFECTIVE_LENGTH_THRESHOLD) -> list[int | None]:
    """``eff(h) = min{d : k(d) - k(0) < threshold}`` (Appendix A.5); ``None`` if never within range.

    The bias is taken relative to distance 0 because softmax ignores a per-head constant; for the
    paper's kernels (KERPLE, ALiBi: ``k(0) = 0``) this is exactly its definition.
    """
    result: list[int | None] = []
    for row in table:
        below = np.flatnonzero(row - row[0] < threshold)
        result.append(int(below[0]) if below.size else None)
    return result


def heads_within(effs: Sequence[int | None], max_distance: int = KERNEL_MAX_DISTANCE) -> np.ndarray:
    """``count[d] = #{h : eff(h) <= d}`` for ``d = 0..max_distance`` (the y-values of Fig. 6)."""
    count = np.zeros(max_distance + 1, dtype=np.int64)
    for eff in effs:
        if eff is not None and eff <= max_distance:
            count[eff:] += 1
    return count


def plot_effective_lengths(
    curves: Mapping[str, Sequence[int | None]],
    path: str | Path,
    *,
    max_distance: int = KERNEL_MAX_DISTANCE,
    title: str = "Number of heads with effective length <= |m - n|",
) -> Path:
    """Cumulative effective-length counts, one step curve per model (Appendix A.5, Fig. 6)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    distances = np.arange(max_distance + 1)
    for name, effs in curves.items():
        ax.step(distances, heads_within(effs, max_distance), where="post", label=name)
    ax.set_xscale("symlog", linthresh=1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("|m - n|")
    ax.set_ylabel("number of heads")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
