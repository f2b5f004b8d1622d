"""Empirical receptive field (thesis §4.5.1, Fig. 4.4).

For the prediction of the last token, ``g_m`` is the gradient of the loss with respect to the
input embedding ``e_m``; ``s_m = ||g_m||_2 / Σ_n ||g_n||_2`` is averaged over held-out sequences, and
``c_m = Σ_{n >= m} s_n`` is the share of the normalized gradient within the last positions. The
empirical receptive field is ``ERF = min{m : c_m > 0.99}`` counted from the end: with
``cumulative[k]`` the share of the last ``k + 1`` positions, ``erf`` is the smallest ``k + 1`` with
``cumulative[k] > 0.99``.
"""

from __future__ import annotations

from typing import Any

import torch

from kerple.progress import progress_bar

ERF_SHARE = 0.99


def normalized_gradients(model: torch.nn.Module, windows: torch.Tensor, batch_size: int = 8,
                         progress: bool = True) -> torch.Tensor:
    """Mean ``s_m`` ``[L]`` over ``windows [N, L + 1]``: inputs ``windows[:, :L]``, the last input
    predicting ``windows[:, L]`` (thesis §4.5.1)."""
    captured: list[torch.Tensor] = []

    def keep_output(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output.retain_grad()
        captured.append(output)
        return output

    hook = model.embedding.word_embeddings.register_forward_hook(keep_output)
    total = torch.zeros(windows.shape[1] - 1, dtype=torch.float64)
    try:
        for start in progress_bar(range(0, len(windows), batch_size), desc="receptive field", disable=not progress):
            batch = windows[start : start + batch_size].to(model.lm_head_weight.device)
            captured.clear()
            with torch.enable_grad():
                logits = model(batch[:, :-1])[:, -1].float()  # [b, V] prediction of the last token
                torch.nn.functional.cross_entropy(logits, batch[:, -1], reduction="sum").backward()
            norms = captured[0].grad.double().norm(dim=-1)  # [b, L] ||g_m||
            total += (norms / norms.sum(dim=-1, keepdim=True)).sum(dim=0).cpu()
            model.zero_grad(set_to_none=True)
    finally:
        hook.remove()
    return total / len(windows)


def cumulative_from_end(shares: torch.Tensor) -> list[float]:
    """``cumulative[k]`` = sum of the last ``k + 1`` entries of ``shares`` (``c_m`` read from the end)."""
    return torch.cumsum(shares.flip(0), dim=0).tolist()


def empirical_receptive_field(cumulative: list[float], share: float = ERF_SHARE) -> int:
    """The smallest ``k + 1`` with ``cumulative[k] > share`` (thesis §4.5.1); the length if none is."""
    for k, value in enumerate(cumulative):
        if value > share:
            return k + 1
    return len(cumulative)


def share_within(cumulative: list[float], recent: int) -> float:
    """The share of the normalized gradient within the last ``recent`` positions, ``c`` at the
    train length read from the end (all of it when ``recent`` covers the input)."""
    return cumulative[min(recent, len(cumulative)) - 1]


def receptive_field(model: torch.nn.Module, windows: torch.Tensor, progress: bool = True) -> dict[str, Any]:
    """The JSON fields of one run: ``per_position`` (mean ``s_m``, oldest first), ``cumulative``, ``erf``."""
    shares = normalized_gradients(model, windows, progress=progress)
    cumulative = cumulative_from_end(shares)
    return {
        "length": int(windows.shape[1] - 1),
        "num_sequences": int(len(windows)),
        "per_position": shares.tolist(),
        "cumulative": cumulative,
        "erf": empirical_receptive_field(cumulative),
    }


def plot_receptive_fields(runs: dict[str, dict[str, Any]], train_length: int | None, title: str) -> Any:
    """Fig. 4.4: the cumulative normalized gradient against the number of most recent tokens."""
    from kerple.analysis.common import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for label, run in runs.items():
        cumulative = run["cumulative"]
        axis.plot(range(1, len(cumulative) + 1), cumulative, label=f"{label} (ERF {run['erf']})")
    axis.axhline(ERF_SHARE, color="grey", linestyle=":", linewidth=1, label=f"ERF threshold {ERF_SHARE:g}")
    if train_length:
        axis.axvline(train_length, color="black", linestyle="--", linewidth=1, label=f"train length {train_length}")
    axis.set_xscale("log")
    axis.set_xlabel("most recent input tokens (k + 1)")
    axis.set_ylabel("cumulative normalized gradient")
    axis.set_ylim(0, 1.02)
    axis.set_title(title)
    axis.legend(fontsize=8)
    return figure
