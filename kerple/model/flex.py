"""FlexAttention kernel: positional terms looked up by distance inside ``score_mod``.

KERPLE-style terms depend only on the distance ``d = i - j`` (paper §3, Eq. 2), so a per-head table
``[H, L]`` built once per forward is enough: ``score_mod`` reads ``scale[h, d]`` and ``bias[h, d]``
on the fly and no ``[H, L, L]`` tensor exists (O(H·L) memory at 16k-64k tokens). Gradients
reach the tables (and through them the learnable parameters) where FlexAttention has a backward
(CUDA); on CPU in torch 2.13 it is forward only.

Masking (causal, and the attention window of thesis §4.3.3) goes into a ``BlockMask`` so fully
masked blocks are skipped; block masks are cached per ``(q_len, k_len, window, device)``. The block
mask is derived from block extents alone (:func:`distance_block_mask`): ``create_block_mask`` would
evaluate the mask on the dense ``L×L`` grid (int64 index tensors of 34 GB at 65536 tokens).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask
from torch.nn.attention.flex_attention import flex_attention as _flex_attention

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
BLOCK_SIZE = 128  # FlexAttention's default tile


def distance_block_mask(
    q_len: int, k_len: int, window: int | None, device: torch.device | str, block_size: int = BLOCK_SIZE
) -> BlockMask:
    """Block mask of ``0 <= d < window`` for ``d = q_idx - kv_idx + (k_len - q_len)``, in O((L/block)²).

    Inside a ``[q block, kv block]`` tile the distances form the contiguous range
    ``[q_first - kv_last, q_last - kv_first] + offset``. A tile is skipped when that range misses
    ``[0, window)``, *full* (no ``mask_mod`` call) when it lies inside and the tile is complete, and
    *partial* (``mask_mod`` applied) otherwise. Equal to ``create_block_mask`` of the same
    ``mask_mod`` (tests compare them) without its dense ``[q_len, k_len]`` evaluation.
    """
    offset = k_len - q_len
    limit = window if window is not None else k_len + 1  # no window: every d >= 0 is allowed

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        distance = q_idx - kv_idx + offset
        return (distance >= 0) & (distance < limit)

    q_first = torch.arange(0, q_len, block_size, device=device)  # [nq]
    q_last = torch.clamp(q_first + block_size - 1, max=q_len - 1)
    kv_first = torch.arange(0, k_len, block_size, device=device)  # [nk]
    kv_last = torch.clamp(kv_first + block_size - 1, max=k_len - 1)
    nearest = q_first[:, None] - kv_last[None, :] + offset  # [nq, nk] smallest distance in the tile
    farthest = q_last[:, None] - kv_first[None, :] + offset  # [nq, nk] largest distance in the tile
    visible = (farthest >= 0) & (nearest < limit)
    complete = ((q_last - q_first + 1) == block_size)[:, None] & ((kv_last - kv_first + 1) == block_size)[None, :]
    full = visible & complete & (nearest >= 0) & (farthest < limit)
    partial = visible & ~full

    def counts_and_indices(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = selected.sum(-1, dtype=torch.int32)[None, None]  # [1, 1, nq]
        order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True)  # selected tiles first
        return counts, order.to(torch.int32)[None, None]  # [1, 1, nq, nk]

    kv_num_blocks, kv_indices = counts_and_indices(partial)
    full_num_blocks, full_indices = counts_and_indices(full)
    return BlockMask.from_kv_blocks(
        kv_num_blocks, kv_indices, full_num_blocks, full_indices,
        BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=(q_len, k_len),
    )


def distance_score_mod(
    bias_table: torch.Tensor | None, scale_table: torch.Tensor | None, offset: int
) -> ScoreMod | None:
    """A ``score_mod`` computing ``score * scale[h, d] + bias[h, d]`` with ``d = q_idx - kv_idx + offset``.

    ``score`` arrives already multiplied by ``1/sqrt(head_dim)``. Distances are clamped into the
    table's range; clamped entries (above the diagonal) are masked by the block mask anyway.
    Returns ``None`` when there is no term at all.
    """
    if bias_table is None and scale_table is None:
        return None
    table = bias_table if bias_table is not None else scale_table
    last = table.shape[-1] - 1

    def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        distance = torch.clamp(q_idx - kv_idx + offset, 0, last)
        if scale_table is not None:
            score = score * scale_table[h, distance]
        if bias_table is not None:
            score = score + bias_table[h, distance]
        return score

    return score_mod


class FlexAttentionKernel:
    """Owns the (optionally compiled) FlexAttention function and the block-mask cache of one model.

    ``compile=True`` wraps ``flex_attention`` in ``torch.compile(dynamic=False)`` once; each new
    sequence length compiles a new kernel (tens of seconds on CPU), later calls reuse it. Without
    compilation FlexAttention runs an unfused reference path that materializes the scores; useful
    for tests only.
    """

    def __init__(self, compile: bool = True) -> None:
        self.compiled = compile
        self._attend = torch.compile(_flex_attention, dynamic=False) if compile else _flex_attention
        self._block_masks: dict[tuple[int, int, int | None, str], BlockMask] = {}

    def __deepcopy__(self, memo: dict) -> FlexAttentionKernel:
        # A compiled function does not deep-copy; a copy starts with its own empty caches.
        return FlexAttentionKernel(self.compiled)

    def __getstate__(self) -> dict:
        return {"compiled": self.compiled}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["compiled"])

    def block_mask(self, q_len: int, k_len: int, window: int | None, device: torch.device) -> BlockMask:
        """Causal (and windowed) block mask; query ``i`` is at position ``k_len - q_len + i``."""
        cache_key = (q_len, k_len, window, str(device))
        if cache_key not in self._block_masks:
            self._block_masks[cache_key] = distance_block_mask(q_len, k_len, window, device)
        return self._block_masks[cache_key]

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        bias_table: torch.Tensor | None,
        scale_table: torch.Tensor | None,
        window: int | None,
    ) -> torch.Tensor:
        """``query [b, H, q, d]``, ``key``/``value [b, H, k, d]`` -> ``[b, H, q, d]``."""
        q_len, k_len = query.shape[-2], key.shape[-2]
        score_mod = distance_score_mod(bias_table, scale_table, k_len - q_len)
        block_mask = self.block_mask(q_len, k_len, window, query.device)
        return self._attend(query, key, value, score_mod=score_mod, block_mask=block_mask)
