"""RegularGPT's relative term: Sliding-Dilated-Attention (thesis §6.2.1, Eq. 6.1) with visible padding.

**Eq. 6.1.** At level ``l`` (0-based) with chunk size ``C`` and dilation ``D = C**l``, query ``m``
sees key ``n`` only when ``(m - n) / D`` is an integer ``k`` in ``[0, C)``, and the learnable
per-head scalar ``r[h, k]`` is added to that logit::

    M[m, n] = r[h, (m - n) / D]   if (m - n) / D in [C]
              -inf                otherwise

**Padding** (§6.2.1, footnote 1: the input is padded when its length does not fit the chunks).
The pattern is *sliding*: query ``m``'s keys are ``m, m - D, ..., m - (C-1)·D``, and those with
``k·D > m`` lie before position 0. Leaving them out is not the same as padding: with ``C = 2`` a
query whose key is absent attends to itself only, exactly as a query whose key holds the same
state, so the model cannot tell "key missing" from "key duplicated". The final position of a
string of length ``T`` then computes what it computes for the string completed to ``2**L`` by
repeating its leading block, and parity flips whenever that block's parity is odd (a test checks
such pairs). Padding must be *visible*: here the input is read as if preceded by PAD tokens.

Every layer's input is laid out as ``[pad, x_0, ..., x_{T-1}]``: slot 0 holds the state of a PAD
token, index ``i >= 1`` is position ``m = i - 1``. A real query's key ``k`` with ``k·D > m`` is
the pad slot, with its own scalar ``r[h, k]``; all such keys share the pad's key and value, so
they enter the softmax as one logit ``q·k_pad/√d + logsumexp_k r[h, k]`` over the absent ``k``.
The pad slot attends to itself only (a PAD token far from the start sees PAD tokens of its own
state at every key, so its attention output is its value whatever the scalars).

This equals left-padding the tokens with real PAD tokens, at the depth ``L = ceil(log_C T)`` of
the unpadded input: every position's logits are those of the input preceded by at least
``K·(C**L - 1)`` PAD tokens (``K`` blocks per level, each reaching ``(C-1)·C**l`` back). With
``K = 1`` the final position needs only the padding to the next power ``C**L``, which completes the
tree of Figure 6.1 and keeps the depth. Tests check both against physically padded inputs.

``padded=False`` keeps the earlier reading (absent keys left out; slot 0 is never visible to a
real query), which checkpoints written before padding were trained with.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from kerple.positional.logit_term import kernel_tensor

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def pad_logits(scalars: torch.Tensor) -> torch.Tensor:
    """``S[h, j] = logsumexp(r[h, j:])`` ``[H, C + 1]`` (``S[h, C] = -inf``): the pad slot's scalar
    term for a query whose absent keys are ``k = j .. C-1``."""
    flipped = torch.logcumsumexp(scalars.flip(-1), dim=-1).flip(-1)  # [H, C]
    return torch.cat([flipped, flipped.new_full((scalars.shape[0], 1), float("-inf"))], dim=-1)


def first_absent_key(length: int, dilation: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """For each position ``m`` in ``[T]`` the smallest ``k`` with ``k·D > m`` (``m // D + 1``), int64 ``[T]``."""
    return torch.div(torch.arange(length, device=device), dilation, rounding_mode="floor") + 1


def dense_term(scalars: torch.Tensor, length: int, dilation: int, padded: bool) -> torch.Tensor:
    """Eq. 6.1 with the pad slot, ``[H, 1 + T, 1 + T]`` (``-inf`` where a query may not look).

    Row and column 0 are the pad slot (it sees only itself); rows/columns ``1..T`` are positions
    ``0..T-1``. Differentiable in ``scalars [H, C]``.
    """
    heads, chunk = scalars.shape
    positions = torch.arange(length, device=scalars.device)
    offset = positions[:, None] - positions[None, :]  # [T, T] m - n
    index = torch.div(offset, dilation, rounding_mode="floor")
    visible = (offset >= 0) & (offset % dilation == 0) & (index < chunk)
    neg_inf = scalars.new_tensor(float("-inf"))
    real = torch.where(visible, scalars[:, index.clamp(0, chunk - 1)], neg_inf)  # [H, T, T]
    if padded:
        pad = pad_logits(scalars)[:, first_absent_key(length, dilation, scalars.device).clamp(max=chunk)]  # [H, T]
    else:
        pad = neg_inf.expand(heads, length)
    top = torch.cat([scalars.new_zeros(heads, 1, 1), neg_inf.expand(heads, 1, length)], dim=-1)  # [H, 1, 1 + T]
    body = torch.cat([pad[:, :, None], real], dim=-1)  # [H, T, 1 + T]
    return torch.cat([top, body], dim=-2)


def gathered_term(scalars: torch.Tensor, length: int, dilation: int, padded: bool) -> torch.Tensor:
    """Eq. 6.1 per (position ``m``, key index ``k``): ``r[h, k]``, or ``-inf`` for an absent key when
    not ``padded``; ``[H, T, C]`` (the kernel reads an absent key from the pad slot)."""
    chunk = scalars.shape[-1]
    term = scalars[:, None, :].expand(-1, length, -1)  # [H, T, C]
    if padded:
        return term
    offsets = torch.arange(chunk, device=scalars.device) * dilation  # [C]
    exists = torch.arange(length, device=scalars.device)[:, None] >= offsets[None, :]  # [T, C]
    return term.masked_fill(~exists, float("-inf"))


class FlexMods(NamedTuple):
    """What :func:`flex_mods` gives a kernel: the two modifications and the tensors they capture."""

    score_mod: ScoreMod
    mask_mod: MaskMod
    captured: tuple[torch.Tensor, ...]


def flex_mods(scalars: torch.Tensor, dilation: int, padded: bool) -> FlexMods:
    """FlexAttention's ``score_mod`` (``+ r[h, k]``; the pad slot's ``logsumexp``) and ``mask_mod``
    (Eq. 6.1 and the pad slot) over the ``[pad, x_0, ...]`` layout; two tables computed from
    ``scalars`` are captured (copies made by :func:`~kerple.positional.logit_term.kernel_tensor`), so
    gradients reach ``scalars`` where FlexAttention has a backward."""
    chunk = scalars.shape[-1]
    table = kernel_tensor(scalars.to(torch.promote_types(scalars.dtype, torch.float32)))
    pad_table = kernel_tensor(pad_logits(table)[:, :chunk])  # the C-th column (no absent key) is masked anyway
    reach = (chunk - 1) * dilation  # a real query at index q has an absent key iff q - 1 < reach

    def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        key_slot = torch.clamp(torch.div(q_idx - kv_idx, dilation, rounding_mode="floor"), 0, chunk - 1)
        pad_slot = torch.clamp(torch.div(q_idx - 1, dilation, rounding_mode="floor") + 1, 0, chunk - 1)
        real = table[h, key_slot]
        pad = pad_table[h, pad_slot]
        return score + torch.where(kv_idx == 0, pad, real)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        offset = q_idx - kv_idx
        real = (kv_idx > 0) & (offset >= 0) & (offset % dilation == 0) & (offset < chunk * dilation)
        pad_visible = q_idx <= reach if padded else q_idx == 0  # the pad slot itself is q_idx 0
        return real | ((kv_idx == 0) & pad_visible)

    return FlexMods(score_mod, mask_mod, (table, pad_table))
