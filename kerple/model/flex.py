"""FlexAttention kernel of the GPT models: the positional logit term evaluated inside ``score_mod``.

The term arrives as a :class:`~kerple.positional.logit_term.LogitTerm`: a closed form computed from
per-head tensors (KERPLE paper §3-4: every term here depends on ``d = i - j`` and a few scalars per
head), or a gather ``table[h, d]`` from the ``[H, L]`` distance tables in the compute dtype. Either
way no ``[H, L, L]`` tensor exists (O(H·L) memory at 16k-64k tokens). Gradients reach the captured
tensors (and through them the learnable parameters) where FlexAttention has a backward (CUDA); on
CPU in the project's torch (docs/development.md, Versions) it is forward only. Compilation, kernel options and their fallback ladder:
:mod:`kerple.model.flex_base`.

Masking (causal, and the attention window of thesis §4.3.3) goes into a ``BlockMask`` so fully
masked blocks are skipped; block masks are cached per ``(q_len, k_len, window, device)``. The block
mask is derived from block extents alone (:func:`distance_block_mask`): ``create_block_mask`` would
evaluate the mask on the dense ``L×L`` grid (int64 index tensors of 34 GB at 65536 tokens).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask

from kerple.model.bias_gradient import with_table_gradient
from kerple.model.flex_base import FlexKernel, ScoreMod, split_lse
from kerple.positional.logit_term import LogitTerm, ScorePosition

BLOCK_SIZE = 128  # FlexAttention's default tile


def distance_block_mask(
    q_len: int, k_len: int, window: int | None, device: torch.device | str, block_size: int = BLOCK_SIZE,
    offset: int | None = None,
) -> BlockMask:
    """Block mask of ``0 <= d < window`` for ``d = q_idx - kv_idx + offset``, in O((L/block)²);
    ``offset`` defaults to ``k_len - q_len`` (the last query at the last key).

    Inside a ``[q block, kv block]`` tile the distances form the contiguous range
    ``[q_first - kv_last, q_last - kv_first] + offset``. A tile is skipped when that range misses
    ``[0, window)``, *full* (no ``mask_mod`` call) when it lies inside and the tile is complete, and
    *partial* (``mask_mod`` applied) otherwise. Equal to ``create_block_mask`` of the same
    ``mask_mod`` (tests compare them) without its dense ``[q_len, k_len]`` evaluation.
    """
    offset = k_len - q_len if offset is None else offset
    limit = window if window is not None else k_len + abs(offset) + 1  # no window: every d >= 0 is allowed

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


def term_score_mod(term: LogitTerm | None, offset: int) -> ScoreMod | None:
    """A ``score_mod`` applying ``term`` to the score of query row ``q_idx`` and key ``kv_idx``.

    Query row ``q_idx`` is absolute position ``q_idx + offset`` (keys start at position 0);
    ``score`` arrives already multiplied by ``1/sqrt(head_dim)``. ``None`` when there is no term.
    """
    if term is None:
        return None

    def score_mod(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return term.apply(score, ScorePosition(b, h, q_idx + offset, kv_idx))

    return score_mod


class FlexAttentionKernel(FlexKernel):
    """The FlexAttention kernel of one GPT model: causal (and windowed) block masks, cached per
    ``(q_len, k_len, window, device)``, and the positional term in ``score_mod``.

    ``closed_form=False`` makes the model hand over its distance tables even for embeddings with a
    closed form (the table gather, e.g. to compare the two on a GPU). ``separate_gradient`` (the
    default) makes the model hand over the distance tables of a learnable term in training: the kernel
    then gets the term detached and the tables' gradient comes from :mod:`kerple.model.bias_gradient`; ``False`` leaves it to FlexAttention's backward (its atomic adds
    per score; for comparisons). ``compile=True`` compiles
    ``flex_attention`` once (``torch.compile(dynamic=False)``); each new sequence length compiles a
    new kernel (tens of seconds on CPU), later calls reuse it. Without compilation FlexAttention
    runs an unfused reference path that materializes the scores; useful for tests only.
    """

    def __init__(self, compile: bool = True, closed_form: bool = True, separate_gradient: bool = True) -> None:
        super().__init__(compile)
        self.closed_form = closed_form
        self.separate_gradient = separate_gradient

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "closed_form": self.closed_form, "separate_gradient": self.separate_gradient}

    def block_mask(self, q_len: int, k_len: int, window: int | None, device: torch.device,
                   offset: int | None = None) -> BlockMask:
        """Causal (and windowed) block mask; query ``i`` is at position ``offset + i`` (default
        ``k_len - q_len + i``)."""
        offset = k_len - q_len if offset is None else offset
        return self.cached_block_mask(
            (q_len, k_len, window, str(device), offset),
            lambda: distance_block_mask(q_len, k_len, window, device, offset=offset),
        )

    def __call__(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, term: LogitTerm | None, window: int | None,
        tables: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """``query [b, H, q, d]``, ``key``/``value [b, H, k, d]`` -> ``[b, H, q, d]``.

        With ``tables`` (``(bias, scale)`` ``[H, k]``, ``q == k``, the term a function of the distance with those
        tables) the kernel runs the term detached and returns its log-sum-exp, and
        :func:`~kerple.model.bias_gradient.with_table_gradient` gives the tables their gradient in the backward
        pass.

        Compiled on a CPU, queries and keys are padded with zeros to whole blocks of
        :data:`BLOCK_SIZE` and the output cut back: Inductor's CPU FlexAttention kernel (the project's torch)
        returned wrong values, NaN at times, for lengths that are not whole blocks on an AVX2 CPU
        (AMD EPYC, 2026-11-27: 40 tokens wrong in 2 of 3 runs, 40 padded to 128 right in 4 of 4). The
        padded keys come after every real query, so the causal mask hides them; padded query rows are
        dropped.
        """
        q_len, k_len = query.shape[-2], key.shape[-2]
        if tables is not None and q_len != k_len:
            raise ValueError(f"the separate positional gradient needs as many queries as keys, got {q_len} and {k_len}")
        if tables is not None and term is not None:
            term = term.detached()
        score_mod = term_score_mod(term, k_len - q_len)
        qkv = (query, key, value)
        pad_q, pad_k = self._cpu_padding(query, q_len), self._cpu_padding(query, k_len)
        if pad_q or pad_k:
            query = F.pad(query, (0, 0, 0, pad_q))
            key, value = F.pad(key, (0, 0, 0, pad_k)), F.pad(value, (0, 0, 0, pad_k))
        block_mask = self.block_mask(q_len + pad_q, k_len + pad_k, window, query.device, offset=k_len - q_len)
        captured = () if term is None else term.tensors
        kind, gathered = ("none", 0) if term is None else (term.kind, term.gathered_bytes)
        result = self.attend(query, key, value, score_mod, block_mask, captured, kind, gathered,
                             return_lse=tables is not None)
        output, lse = split_lse(result) if tables is not None else (result, None)
        if pad_q:
            output = output[..., :q_len, :]
            lse = None if lse is None else lse[..., :q_len]
        if tables is None:
            return output
        return with_table_gradient(output, *qkv, lse, *tables, window)

    def _cpu_padding(self, query: torch.Tensor, length: int) -> int:
        """Zeros to append to ``length`` rows for the compiled CPU kernel (0 elsewhere)."""
        if not self.compiled or query.device.type != "cpu":
            return 0
        return -length % BLOCK_SIZE
