"""Attention alignment by softmax temperature (thesis §5.4, Algorithm 1).

``S(τ)`` is the mean, over every softmax row of every layer and head, of the row's maximum
probability (mode ``pmax``) or entropy (mode ``entropy``) with all softmaxes at temperature τ.
The train-length statistic ``S_tr(1)`` is the target; the chosen ``τ_ex`` is the grid value
(1.0, 0.95, ..., 0.5) whose ``S_ex(τ_ex)`` is nearest to it.
"""

from __future__ import annotations

from typing import Any, Callable

MODES = ("pmax", "entropy")
GRID = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))  # 1.0, 0.95, ..., 0.5


def closest_temperature(target: float, statistics: dict[float, float]) -> float:
    """The τ whose statistic is nearest ``target`` (Algorithm 1's ``S_ex(τ) ≈ S_tr(1)``); ties go to
    the larger τ, the smaller change to the model."""
    return min(statistics, key=lambda tau: (abs(statistics[tau] - target), -tau))


def align(statistic: Callable[[str, float], float], grid: tuple[float, ...] = GRID,
          progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Algorithm 1 on a statistic ``statistic(which, τ)`` with ``which`` in ``{"train", "extrapolation"}``.

    Returns ``temperature`` (the chosen τ), ``target`` (``S_tr(1)``), ``grid`` (τ -> ``S_ex(τ)``),
    ``gap`` (``S_ex(τ) - S_tr(1)`` at the chosen τ) and ``reached``: whether the grid's statistics
    bracket the target. When they do not, the chosen τ is only the grid's end nearest the target,
    not an aligned temperature.
    """
    target = statistic("train", 1.0)
    values = {}
    for tau in grid:
        values[tau] = statistic("extrapolation", tau)
        if progress is not None:
            progress(tau)
    chosen = closest_temperature(target, values)
    return {"temperature": chosen, "target": target, "gap": values[chosen] - target,
            "reached": min(values.values()) <= target <= max(values.values()),
            "grid": {f"{tau:g}": value for tau, value in values.items()}}


def describe(mode: str, result: dict[str, Any], train_length: int, length: int) -> str:
    """One line on the choice: τ, the statistic it reaches against the target, and whether the grid reached it."""
    unit = " nats" if mode == "entropy" else ""
    name = "mean P_max" if mode == "pmax" else "mean entropy"
    tau, target = result["temperature"], result["target"]
    line = (f"mode {mode}: τ = {tau:g} ({name} at L={length}, τ={tau:g}: {target + result['gap']:.4f}{unit}; "
            f"target at L={train_length}, τ=1: {target:.4f}{unit})")
    if not result["reached"]:
        line += (f"; not aligned: no τ in [{min(GRID):g}, {max(GRID):g}] reaches the target, "
                 f"τ = {tau:g} is the grid's end")
    return line


def plot_alignment(results: dict[str, dict[str, Any]], title: str, log_baseline: float | None = None) -> Any:
    """``S_ex(τ)`` over the grid against the target ``S_tr(1)``, one panel per mode; ``log_baseline``
    marks the length-only ``τ = log_{L_ex} L_tr`` (thesis §5.5)."""
    from kerple.analysis.common import pyplot

    plt = pyplot()
    figure, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.4), squeeze=False)
    for axis, (mode, result) in zip(axes[0], results.items()):
        taus = [float(tau) for tau in result["grid"]]
        axis.plot(taus, list(result["grid"].values()), marker="o", label="extrapolation length")
        axis.axhline(result["target"], color="black", linestyle="--", linewidth=1, label="train length, τ = 1")
        chosen = result["temperature"]
        verdict = "" if result.get("reached", True) else " (grid's end, not aligned)"
        axis.axvline(chosen, color="tab:red", linestyle=":", label=f"chosen τ = {chosen:g}{verdict}")
        if log_baseline is not None:
            axis.axvline(log_baseline, color="grey", linestyle="-.", linewidth=1,
                         label=f"log_L_ex(L_tr) = {log_baseline:.3g}")
        axis.set_xlabel("softmax temperature τ")
        axis.set_ylabel("mean P_max" if mode == "pmax" else "mean entropy (nats)")
        axis.invert_xaxis()
        axis.legend(fontsize=8)
    figure.suptitle(title)
    return figure
