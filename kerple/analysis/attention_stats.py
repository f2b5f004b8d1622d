"""Sharpness of attention: mean maximum probability ``P_max`` and entropy ``H`` of the softmax rows
per layer and head (thesis §5.3.3, Table 5.1: longer inputs give flatter rows, "dispersed attention").

The statistics are taken from the queries and keys each layer actually sees (a forward pre-hook on
every attention block reads its input and the shared :class:`~kerple.model.attention.AttentionContext`),
``block_rows`` query rows at a time, so no ``L×L`` matrix of a whole sequence is held: the model's
own kernel (flex at long lengths) runs the forward, and the rows are rebuilt block by block with
the same order of operations (scores · logit scale + bias, mask, divided by τ).

The thesis measures a T5 encoder, whose every row sees all ``L`` keys; here the models are causal,
so row ``i`` sees ``i + 1`` keys (fewer under a window) and the first rows are sharp by necessity.
Every row counts once, as in Algorithm 1; :func:`uniform_statistics` gives the flattest values
possible at a length, to read a measurement against.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kerple.model.attention import AttentionContext, SelfAttention
from kerple.progress import progress_bar


def row_statistics(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``P_max`` and entropy ``H = -Σ p log p`` of each softmax row of ``probs [..., k]`` -> two ``[...]``."""
    return probs.amax(dim=-1), -torch.special.xlogy(probs, probs).sum(dim=-1)


def block_logits(query: torch.Tensor, key: torch.Tensor, context: AttentionContext, first: int,
                 last: int) -> torch.Tensor:
    """Logits of query rows ``first:last`` ``[b, H, rows, k]`` in fp32, ``-inf`` where a key is not visible.

    ``query`` is already divided by τ and ``context.bias_table`` (or the closed form's bias) too (as
    :class:`SelfAttention` does).
    """
    device = query.device
    rows = torch.arange(first, last, device=device) + (context.k_len - context.q_len)
    distance = rows[:, None] - torch.arange(context.k_len, device=device)[None, :]  # [rows, k]
    visible = distance >= 0
    if context.window is not None:
        visible &= distance < context.window
    index = distance.clamp(min=0, max=context.k_len - 1)
    scores = query[:, :, first:last].float() @ key.float().transpose(-1, -2) / math.sqrt(query.shape[-1])
    if context.scale_table is not None:
        scores = scores * context.scale_table[:, index]  # [H, rows, k] broadcast over b
    if context.bias_table is not None:
        scores = scores + context.bias_table[:, index]
    term = context.grid_term  # an embedding without distance tables (FIRE, CABLE): its closed form
    if term is not None:
        grid = context.score_grid(*query.shape[:2])
        scores = term.apply(scores, grid._replace(query=grid.query[..., first:last, :]))
    return scores.masked_fill(~visible, float("-inf"))


def layer_statistics(attention: SelfAttention, hidden: torch.Tensor, context: AttentionContext,
                     block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over batch and rows of ``P_max`` and ``H`` per head ``[H]`` for one layer's input ``hidden [b, s, h]``."""
    batch, seq, _ = hidden.shape
    context = context.for_layer(attention.layer_index, hidden)  # a term of the layer's input (CABLE)
    qkv = attention.query_key_value(hidden).view(batch, seq, attention.num_heads, 3 * attention.head_dim)
    query, key, _ = qkv.transpose(1, 2).split(attention.head_dim, dim=-1)  # each [b, H, s, d]
    query, key = context.rotate(query, key, context.q_positions, context.q_positions)
    query = query / context.temperature
    pmax_sum = torch.zeros(attention.num_heads, dtype=torch.float64, device=hidden.device)
    entropy_sum = torch.zeros_like(pmax_sum)
    for first in range(0, seq, block_rows):
        probs = torch.softmax(block_logits(query, key, context, first, min(seq, first + block_rows)), dim=-1)
        pmax, entropy = row_statistics(probs)  # [b, H, rows]
        pmax_sum += pmax.double().sum(dim=(0, 2))
        entropy_sum += entropy.double().sum(dim=(0, 2))
    return pmax_sum, entropy_sum


def uniform_statistics(length: int, window: int | None = None) -> tuple[float, float]:
    """Mean ``P_max`` and entropy of uniform attention over each causal row's visible keys (row ``i``
    sees ``min(i + 1, w)``): the flattest rows a model of this length can have, for reference."""
    visible = [min(i + 1, window or length) for i in range(length)]
    return sum(1 / n for n in visible) / length, sum(math.log(n) for n in visible) / length


@torch.no_grad()
def attention_statistics(model: torch.nn.Module, windows: torch.Tensor, temperature: float = 1.0,
                         batch_size: int = 4, block_rows: int = 256, progress: bool = True) -> dict[str, Any]:
    """Mean ``P_max`` and ``H`` per layer and head ``[R][H]`` (and over all rows, as Algorithm 1
    averages them) of ``model`` on ``windows [N, L]`` with every softmax at ``temperature``."""
    layers = [layer.attention for layer in model.layers]
    sums = torch.zeros(2, len(layers), model.num_heads, dtype=torch.float64)

    def make_hook(index: int):  # noqa: ANN202 - a forward pre-hook
        def hook(module: SelfAttention, inputs: tuple[torch.Tensor, AttentionContext]) -> None:
            pmax, entropy = layer_statistics(module, inputs[0], inputs[1], block_rows)
            sums[0, index] += pmax.cpu()
            sums[1, index] += entropy.cpu()
        return hook

    handles = [attention.register_forward_pre_hook(make_hook(i)) for i, attention in enumerate(layers)]
    previous = model.softmax_temperature
    model.set_temperature(temperature)
    try:
        for start in progress_bar(range(0, len(windows), batch_size), desc=f"attention L={windows.shape[1]} τ={temperature:g}",
                          disable=not progress, leave=False):
            model(windows[start : start + batch_size].to(model.lm_head_weight.device))
    finally:
        model.set_temperature(previous)
        for handle in handles:
            handle.remove()
    means = sums / (windows.shape[0] * windows.shape[1])
    uniform_pmax, uniform_entropy = uniform_statistics(windows.shape[1], getattr(model, "attention_window", None))
    return {
        "length": int(windows.shape[1]),
        "temperature": temperature,
        "pmax": means[0].tolist(),
        "entropy": means[1].tolist(),
        "mean_pmax": float(means[0].mean()),
        "mean_entropy": float(means[1].mean()),
        "uniform_pmax": uniform_pmax,
        "uniform_entropy": uniform_entropy,
    }


def plot_statistics(rows: list[dict[str, Any]], title: str) -> Any:
    """Mean ``P_max`` and entropy per layer against the length (Table 5.1 as a plot)."""
    from kerple.analysis.common import pyplot

    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    lengths = [row["length"] for row in rows]
    for field, axis, label in (("pmax", axes[0], "mean P_max"), ("entropy", axes[1], "mean entropy (nats)")):
        for layer in range(len(rows[0][field])):
            axis.plot(lengths, [sum(row[field][layer]) / len(row[field][layer]) for row in rows], marker="o",
                      label=f"layer {layer}")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("length (tokens)")
        axis.set_ylabel(label)
    axes[0].legend(fontsize=8)
    figure.suptitle(title)
    return figure
