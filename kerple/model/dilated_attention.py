"""Sliding-Dilated-Attention of RegularGPT (thesis §6.2.1, Eq. 6.1).

At layer level ``l`` (0-based) with chunk size ``C`` and dilation ``D = C**l``, query ``m`` sees key
``n`` only when ``(m - n) / D`` is an integer ``k`` in ``[0, C)``; the learnable per-head scalar
``r[h, k]`` is added to that logit::

    M[m, n] = r[(m - n) / D]   if (m - n) / D in [C]
              -inf             otherwise

Padding and causality. Eq. 6.1 is a *sliding* pattern (it depends on ``m - n`` only), so every
query has its own window ``m, m - D, ..., m - (C-1)·D``. The thesis pads the input to a multiple of
``C``; here a key that would lie before position 0 is simply absent, which is the same as
left-padding with masked pad keys, and a right pad is never visible to a real query because the
mask is causal (``k >= 0``). Padding therefore changes no output of a real position and is not
materialised; the only length-dependent quantity is the depth (:func:`adaptive_depth`), which
padding ``T`` up to a multiple of ``C`` leaves unchanged.

Three kernels compute the same function (tests check agreement to 1e-5 in fp32):

* ``dense``: the ``[H, T, T]`` bias/mask of Eq. 6.1 added to fp32 scores (the reference);
* ``gather``: for each ``k`` in ``[C]`` the key at ``m - k·D`` is gathered, so scores are
  ``[b, H, T, C]`` (O(T·C) instead of O(T²));
* ``flex``: FlexAttention with a ``mask_mod``/``score_mod`` computing the mask and ``r[h, k]`` on the
  fly and a block-sparse ``BlockMask`` (forward only on CPU).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from torch.nn.attention.flex_attention import flex_attention as _flex_attention

DILATED_IMPLS: tuple[str, ...] = ("eager", "flex")


def adaptive_depth(length: int, chunk_size: int) -> int:
    """``L̄ = ceil(log_C T)`` (thesis §6.2.2), at least 1: the smallest ``L`` with ``C**L >= T``.

    Computed with integers so that exact powers (``T = C**L``) do not round up.
    """
    if length < 1 or chunk_size < 2:
        raise ValueError(f"adaptive_depth needs length >= 1 and chunk_size >= 2, got {length} and {chunk_size}")
    depth, reach = 1, chunk_size
    while reach < length:
        depth, reach = depth + 1, reach * chunk_size
    return depth


def dilated_pattern(length: int, chunk_size: int, dilation: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6.1 on a ``[T, T]`` grid: (visible bool, ``k`` index int64 clamped into ``[0, C)``)."""
    positions = torch.arange(length, device=device)
    offset = positions[:, None] - positions[None, :]  # [T, T] m - n
    index = torch.div(offset, dilation, rounding_mode="floor")
    visible = (offset >= 0) & (offset % dilation == 0) & (index < chunk_size)
    return visible, index.clamp(0, chunk_size - 1)


def dense_dilated_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scalars: torch.Tensor, dilation: int
) -> torch.Tensor:
    """Reference kernel: ``query``/``key``/``value [b, H, T, d]``, ``scalars [H, C]`` -> ``[b, H, T, d]``."""
    length, chunk = query.shape[-2], scalars.shape[-1]
    visible, index = dilated_pattern(length, chunk, dilation, query.device)
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) / math.sqrt(query.shape[-1])  # [b, H, T, T]
    scores = scores + scalars.float()[:, index]  # [H, T, T] broadcast over b
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(probs, value)


def gather_dilated_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scalars: torch.Tensor, dilation: int
) -> torch.Tensor:
    """O(T·C) kernel: the ``C`` visible keys ``m - k·D`` of each query are gathered (same math as dense)."""
    length, chunk = query.shape[-2], scalars.shape[-1]
    reach = (chunk - 1) * dilation
    padded_key = F.pad(key.float(), (0, 0, reach, 0))  # [b, H, reach + T, d]
    padded_value = F.pad(value, (0, 0, reach, 0))
    starts = [reach - k * dilation for k in range(chunk)]  # key of query m for index k sits at m + start
    keys = torch.stack([padded_key[..., s : s + length, :] for s in starts], dim=-2)  # [b, H, T, C, d]
    values = torch.stack([padded_value[..., s : s + length, :] for s in starts], dim=-2)
    scores = torch.einsum("bhtd,bhtcd->bhtc", query.float(), keys) / math.sqrt(query.shape[-1])
    scores = scores + scalars.float()[:, None, :]  # [H, 1, C]
    offsets = torch.arange(chunk, device=query.device) * dilation  # [C]
    exists = torch.arange(length, device=query.device)[:, None] >= offsets[None, :]  # [T, C] key m - k·D >= 0
    scores = scores.masked_fill(~exists, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.einsum("bhtc,bhtcd->bhtd", probs, values)


def eager_dilated_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scalars: torch.Tensor, dilation: int
) -> torch.Tensor:
    """``eager``: the gather kernel while its ``[T, C·d]`` keys are smaller than the dense ``[T, T]``
    scores per head, else the dense one (both exact)."""
    if scalars.shape[-1] * query.shape[-1] < query.shape[-2]:
        return gather_dilated_attention(query, key, value, scalars, dilation)
    return dense_dilated_attention(query, key, value, scalars, dilation)


MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def dilated_mask_mod(chunk_size: int, dilation: int) -> MaskMod:
    """FlexAttention ``mask_mod`` of Eq. 6.1: ``q - kv = k·D`` with ``k`` in ``[C]``."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        offset = q_idx - kv_idx
        return (offset >= 0) & (offset % dilation == 0) & (offset < chunk_size * dilation)

    return mask_mod


class DilatedFlexKernel:
    """FlexAttention for Eq. 6.1 with block masks cached per ``(T, C, D, device)``.

    ``create_block_mask`` marks the tiles with no visible pair as empty, so the kernel skips them
    (block-sparse); ``score_mod`` adds ``r[h, (q - kv) // D]``. ``compile=False`` runs FlexAttention's
    unfused reference path (tests only).
    """

    def __init__(self, compile: bool = True) -> None:
        self.compiled = compile
        self._attend = torch.compile(_flex_attention, dynamic=False) if compile else _flex_attention
        self._block_masks: dict[tuple[int, int, int, str], BlockMask] = {}

    def __deepcopy__(self, memo: dict) -> DilatedFlexKernel:
        return DilatedFlexKernel(self.compiled)

    def __getstate__(self) -> dict:
        return {"compiled": self.compiled}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["compiled"])

    def block_mask(self, length: int, chunk_size: int, dilation: int, device: torch.device) -> BlockMask:
        """The block-sparse mask of Eq. 6.1 for ``length`` tokens (cached)."""
        cache_key = (length, chunk_size, dilation, str(device))
        if cache_key not in self._block_masks:
            mask_mod = dilated_mask_mod(chunk_size, dilation)
            self._block_masks[cache_key] = create_block_mask(mask_mod, None, None, length, length, device=device)
        return self._block_masks[cache_key]

    def __call__(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scalars: torch.Tensor, dilation: int
    ) -> torch.Tensor:
        """``query``/``key``/``value [b, H, T, d]``, ``scalars [H, C]`` -> ``[b, H, T, d]``."""
        chunk = scalars.shape[-1]
        table = scalars.float()

        def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            index = torch.clamp(torch.div(q_idx - kv_idx, dilation, rounding_mode="floor"), 0, chunk - 1)
            return score + table[h, index]

        block_mask = self.block_mask(query.shape[-2], chunk, dilation, query.device)
        return self._attend(query, key, value, score_mod=score_mod, block_mask=block_mask)
