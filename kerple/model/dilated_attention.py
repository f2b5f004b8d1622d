"""The attention kernels of RegularGPT's Sliding-Dilated-Attention (thesis §6.2.1, Eq. 6.1).

The relative term (the pattern, the scalars ``r[h, k]`` and the visible padding) is
:mod:`kerple.positional.dilated`'s; this module attends with it. Every kernel takes
``query``/``key``/``value [b, H, 1 + T, d]`` laid out as ``[pad, x_0, ..., x_{T-1}]`` (slot 0 is the
pad token's state, see :mod:`kerple.positional.dilated`), ``scalars [H, C]``, the dilation ``D``
and whether the pad is visible, and returns ``[b, H, 1 + T, d]``.

Three kernels compute the same function (tests check agreement to 1e-5 in fp32):

* ``dense``: the ``[H, 1 + T, 1 + T]`` term added to fp32 (or fp64) scores (the reference);
* ``gather``: for each ``k`` in ``[C]`` the key at ``m - k·D`` (or the pad) is gathered, so scores
  are ``[b, H, T, C]`` (O(T·C) instead of O(T²));
* ``flex``: FlexAttention with the term's ``score_mod``/``mask_mod`` and a block-sparse
  ``BlockMask`` (forward only on CPU).
"""

from __future__ import annotations

import math

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from kerple.model.flex_base import FlexKernel
from kerple.positional.dilated import dense_term, flex_mods, gathered_term


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


def scores_dtype(query: torch.Tensor) -> torch.dtype:
    """Scores and softmax run in fp32, or in the query's dtype when it is wider (fp64 references)."""
    return torch.promote_types(query.dtype, torch.float32)


def dense_dilated_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scalars: torch.Tensor, dilation: int, padded: bool
) -> torch.Tensor:
    """Reference kernel: softmax over the ``[1 + T, 1 + T]`` scores plus :func:`dense_term`."""
    length, dtype = query.shape[-2] - 1, scores_dtype(query)
    scores = torch.matmul(query.to(dtype), key.to(dtype).transpose(-1, -2)) / math.sqrt(query.shape[-1])  # [b, H, 1+T, 1+T]
    scores = scores + dense_term(scalars.to(dtype), length, dilation, padded)
    return torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)


def gather_dilated_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scalars: torch.Tensor, dilation: int, padded: bool
) -> torch.Tensor:
    """O(T·C) kernel: each real query's ``C`` keys ``m - k·D`` are gathered from the keys preceded by
    ``(C-1)·D`` copies of the pad's key (an absent key reads the pad); the pad slot returns its value."""
    batch, heads, slots, dim = key.shape
    length, chunk, dtype = slots - 1, scalars.shape[-1], scores_dtype(query)
    reach = (chunk - 1) * dilation

    def preceded_by_pad(tensor: torch.Tensor) -> torch.Tensor:  # [b, H, reach + T, d]
        return torch.cat([tensor[..., :1, :].expand(batch, heads, reach, dim), tensor[..., 1:, :]], dim=-2)

    keys_padded, values_padded = preceded_by_pad(key.to(dtype)), preceded_by_pad(value)
    starts = [reach - k * dilation for k in range(chunk)]  # query m's key k sits at m + start
    keys = torch.stack([keys_padded[..., s : s + length, :] for s in starts], dim=-2)  # [b, H, T, C, d]
    values = torch.stack([values_padded[..., s : s + length, :] for s in starts], dim=-2)
    scores = torch.einsum("bhtd,bhtcd->bhtc", query[..., 1:, :].to(dtype), keys) / math.sqrt(dim)
    scores = scores + gathered_term(scalars.to(dtype), length, dilation, padded)  # [H, T, C] broadcast over b
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.cat([value[..., :1, :], torch.einsum("bhtc,bhtcd->bhtd", probs, values)], dim=-2)


def eager_dilated_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scalars: torch.Tensor, dilation: int, padded: bool
) -> torch.Tensor:
    """``eager``: the gather kernel while its ``[T, C·d]`` keys are smaller than the dense ``[T, T]``
    scores per head, else the dense one (both exact)."""
    if scalars.shape[-1] * query.shape[-1] < query.shape[-2]:
        return gather_dilated_attention(query, key, value, scalars, dilation, padded)
    return dense_dilated_attention(query, key, value, scalars, dilation, padded)


class DilatedFlexKernel(FlexKernel):
    """FlexAttention for Eq. 6.1 with block masks cached per ``(1 + T, C, D, padded, device)``.

    ``create_block_mask`` marks the tiles with no visible pair as empty, so the kernel skips them
    (block-sparse). The score modification gathers ``r[h, k]`` and the pad slot's term from two
    float32 ``[H, C]`` tables (shared memory per score tile: :mod:`kerple.model.flex_options`).
    Compilation, options and copies: :class:`~kerple.model.flex_base.FlexKernel`; ``compile=False``
    runs FlexAttention's unfused reference path (tests only).
    """

    def block_mask(self, scalars: torch.Tensor, slots: int, dilation: int, padded: bool, device: torch.device) -> BlockMask:
        """The block-sparse mask of Eq. 6.1 with the pad slot over ``slots = 1 + T`` (cached)."""

        def build() -> BlockMask:
            mask_mod = flex_mods(scalars.detach(), dilation, padded).mask_mod
            return create_block_mask(mask_mod, None, None, slots, slots, device=device)

        return self.cached_block_mask((slots, scalars.shape[-1], dilation, padded, str(device)), build)

    def __call__(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scalars: torch.Tensor, dilation: int, padded: bool
    ) -> torch.Tensor:
        """``query``/``key``/``value [b, H, 1 + T, d]``, ``scalars [H, C]`` -> ``[b, H, 1 + T, d]``."""
        mods = flex_mods(scalars, dilation, padded)
        block_mask = self.block_mask(scalars, query.shape[-2], dilation, padded, query.device)
        table_bytes = torch.promote_types(scalars.dtype, torch.float32).itemsize  # flex_mods' two tables
        return self.attend(query, key, value, mods.score_mod, block_mask, mods.captured, "dilated_table", 2 * table_bytes)
