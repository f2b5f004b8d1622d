"""``alibi``: attention with linear biases (Press et al. 2022), bias ``-slope_h * d``.

Slopes follow the standard geometric rule (docs/reference-format.md §3). The thesis (§4.4, Table 4.1) writes a
slope as ``1/2^h`` and studies two variations, exposed here as options:

* ``alibi_slope_shift`` Δ ("shift all h by Δ", §4.4.1): every head's exponent ``h`` is shifted,
  slope ``1/2^(h+Δ)``, i.e. every standard slope is multiplied by ``2^-Δ``. For ``H`` a power of
  two the standard exponents are ``h_n = 8n/H``; for other head counts they are the exponents of
  the interleaved slopes of docs/reference-format.md §3 (``h_n = -log2(standard slope_n)``; H = 12:
  1..8, 0.5, 1.5, 2.5, 3.5). The thesis' runs use H = 12 (Table 4.7), a non-power-of-two count,
  and its §4.6.1 loosely writes ALiBi's exponents as ``n·8/H``; we keep the reference's exact
  slopes and shift each exponent by Δ, the reading that matches "shift h by a fixed amount" for
  every H (Δ counts halvings of the slope, not multiples of the head spacing ``8/H``).
* ``alibi_equal_slope`` h ("same h for all heads", §4.4.2): every head gets slope ``1/2^h``.

Setting both (an equal slope and a non-zero shift) is ambiguous and refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind
from kerple.positional.functional import distance_vector
from kerple.positional.logit_term import LogitTerm, per_head_term
from kerple.positional.options import option


def alibi_slopes(num_heads: int) -> list[float]:
    """Standard ALiBi slopes for ``num_heads`` heads (docs/reference-format.md §3).

    Power of two: ``2^(-8n/H)`` for ``n = 1..H``. Otherwise, with ``P = 2^floor(log2 H)``: the
    ``P`` slopes of ``P`` heads followed by every other slope (the 1st, 3rd, ...) of the ``2P``-head
    sequence, ``H - P`` of them. H = 12: ``2^-1 ... 2^-8, 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5``.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    power = 2 ** int(math.floor(math.log2(num_heads)))
    if power == num_heads:
        return [2.0 ** (-8.0 * n / num_heads) for n in range(1, num_heads + 1)]
    return alibi_slopes(power) + alibi_slopes(2 * power)[0::2][: num_heads - power]


def shifted_slopes(num_heads: int, slope_shift: float = 0.0, equal_slope: float | None = None) -> list[float]:
    """Slopes with the thesis Table 4.1 variations applied (see the module docstring)."""
    if equal_slope is not None:
        if slope_shift:
            raise ValueError("alibi_equal_slope and a non-zero alibi_slope_shift cannot be combined")
        return [2.0 ** (-float(equal_slope))] * num_heads
    return [slope * 2.0 ** (-float(slope_shift)) for slope in alibi_slopes(num_heads)]


def linear_bias(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """ALiBi's ``-slope * d`` (Press et al. 2022, §3), ``slope = params["slope"]``."""
    return -params["slope"] * distance


@dataclass(frozen=True)
class AlibiOptions:
    """Options of ``alibi`` (the thesis' Table 4.1 variations)."""

    alibi_slope_shift: float = option(
        0.0, "Shift added to every ALiBi slope exponent: slope 1/2^(h + shift) instead of 1/2^h (thesis Table 4.1)."
    )
    alibi_equal_slope: int | None = option(
        None, "If set to h, every ALiBi head gets the same slope 1/2^h (thesis Table 4.1)."
    )


class AlibiBias(PositionalEmbedding):
    """ALiBi: ``bias[h, d] = -slopes[h] * d``; buffer ``slopes`` ``[H]`` as ``alibi_embed.slopes``.

    With tensor parallelism the slopes are those of the global heads
    ``head_offset .. head_offset + num_heads - 1`` out of ``total_heads``.
    Tables are not cached: ``-slopes * d`` costs as little as a cache lookup and stays correct when
    a checkpoint overwrites the slopes.
    """

    kind = PositionKind.BIAS
    state_dict_name = "alibi_embed"
    options_class = AlibiOptions

    def __init__(self, shape: ModelShape, options: AlibiOptions = AlibiOptions()) -> None:
        super().__init__(shape)
        heads = shape.head_indices()
        all_slopes = shifted_slopes(shape.all_heads, options.alibi_slope_shift, options.alibi_equal_slope)
        self.register_buffer("slopes", torch.tensor([all_slopes[h] for h in heads], dtype=torch.float32))

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``-slopes[:, None] * d`` float32 ``[H, k_len]``; no scale table."""
        distance = distance_vector(k_len, device)
        slopes = self.slopes.to(device=distance.device, dtype=torch.float32)[:, None]  # [H, 1]
        return linear_bias({"slope": slopes}, distance), None

    def logit_term(self) -> LogitTerm:
        """``-slope_h * d`` per score from the ``[H]`` slopes."""
        return LogitTerm((self.slopes.float(),), bias=per_head_term(linear_bias, ("slope",)))

    def export_terms(self) -> dict[str, dict[str, Any]]:
        """``-a * d^p`` with ``a`` the slopes and ``p = 1``."""
        return {"bias": {"form": "power", "a": {"tensor": "slopes"}}}
