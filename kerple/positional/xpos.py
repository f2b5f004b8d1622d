"""``xpos``: rotary embedding with an exponential decay per dimension (Sun et al. 2022, *A
Length-Extrapolatable Transformer*, arXiv 2212.10554, the "extrapolatable position embedding").

Queries and keys are rotated as by :mod:`kerple.positional.rotary` (GPT-NeoX's halves layout,
``rotary_pct``, ``rotary_emb_base``), and each rotated pair ``c`` is also scaled: the query at
position ``n`` by ``ζ_c^(n/B)``, the key at position ``m`` by ``ζ_c^(-m/B)``, so their product
carries ``ζ_c^((n - m)/B)``, a decay with the distance that is fastest for the high-frequency pairs
(small ``c``):

    ζ_c = (2c/r + γ) / (1 + γ),   c = 0 .. r/2 - 1,   r = rotary dims,   γ = 0.4,   B = 512.

The paper decays every pair of the head (``r = head_dim``); with ``rotary_pct < 1`` only the rotated
pairs are decayed, ``ζ_c`` spaced over their width ``r``, and the other channels pass unscaled.

Only the start of the paper's text could be read where this was written, so the details follow the
authors' implementation in torchscale (``XPOS``): γ = 0.4 (its ``0.4 * head_dim``), the scale base
``B = 512``, the pairing of ``ζ_c`` with the ``c``-th frequency, and positions of the scale centred
so that the factors stay in range (only ``n - m`` matters).
Here the centre is fixed, ``max_positions // 2``, rather than half of each call's length: a KV
cache keeps keys scaled at earlier calls, and a centre that moved with the length would break
``ζ^((n - m)/B)`` between them. The rotation itself uses the absolute positions, as torchscale's.

Range: the largest factor is ``(1/ζ_0)^(|t - centre|/B)`` = ``3.5^(|t - centre|/512)`` at γ = 0.4;
it reaches float16's largest value (65,504) about 4,500 positions from the centre, and
float32/bfloat16's (3.4e38) about 36,000 from it. Past that the rotated keys, cast to the compute
dtype, are inf and every score that reads them NaN (float16, N(0, 1) keys, max_positions 512: finite
at 4,096 tokens, inf from 4,700). :meth:`XposEmbedding.length_problem` refuses, before a run or an
evaluation starts, a length whose factor would exceed the dtype's largest value divided by
:data:`HEADROOM` (room for keys up to 256 in magnitude): in float16 about 2,260 positions either side
of the centre (so ``max_positions // 2 + 2,266`` tokens), in float32/bfloat16 about 34,000.
Half-precision runs that evaluate long should use bf16.

``rope_scaling`` (rotary's option) rescales the rotation's frequencies as for ``rotary``; the decay
keeps its positions (every ``rope_type`` but ``proportional``, which would rotate channels ζ does not cover).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kerple.positional.options import option
from kerple.positional.base import ModelShape
from kerple.positional.rotary import RotaryEmbedding, RotaryOptions, refuse_rope_scaling


HEADROOM = 2.0**8  # the dtype's largest value over the largest factor: room for the keys' own magnitude


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


@dataclass(frozen=True)
class XposOptions(RotaryOptions):
    """Options of ``xpos``: rotary's (``rotary_pct``, ``rotary_emb_base``) and the decay's."""

    xpos_scale_base: float = option(
        512.0, "Scale base B of xPos: queries are scaled by zeta^(n/B), keys by zeta^(-m/B); 512 as torchscale's XPOS.",
        minimum=1.0,
    )
    xpos_gamma: float = option(
        0.4,
        "gamma of xPos's per-dimension decay zeta_c = (2c/r + gamma)/(1 + gamma); 0.4 as the xPos paper and torchscale.",
        check=_positive,
    )


def xpos_decay(rotary_ndims: int, gamma: float) -> torch.Tensor:
    """``ζ_c = (2c/r + γ)/(1 + γ)`` for ``c = 0 .. r/2 - 1`` as float32 ``[r/2]`` (xPos)."""
    pair = torch.arange(0, rotary_ndims, 2, dtype=torch.float32)  # 2c
    return (pair / rotary_ndims + gamma) / (1.0 + gamma)


def xpos_reach(dtype: torch.dtype, gamma: float, scale_base: float) -> int:
    """The largest ``|t - centre|`` whose factor ``(1/ζ_0)^(|t - centre|/B)``, ``ζ_0 = γ/(1 + γ)`` the
    smallest decay, stays within ``finfo(dtype).max / HEADROOM``."""
    zeta_smallest = gamma / (1.0 + gamma)
    return int(scale_base * math.log(torch.finfo(dtype).max / HEADROOM) / -math.log(zeta_smallest))


class XposEmbedding(RotaryEmbedding):
    """xPos: rotary plus the decay ``ζ^(±t/B)``; buffers ``inv_freq`` and ``decay`` ``[r/2]``,
    stored as ``xpos.inv_freq`` and ``xpos.decay``."""

    state_dict_name = "xpos"
    options_class = XposOptions

    def __init__(self, shape: ModelShape, options: XposOptions = XposOptions()) -> None:
        if (options.rope_scaling or {}).get("rope_type") == "proportional":
            raise ValueError("xpos's decay covers the rotary_pct channels only: use another rope_type")
        super().__init__(shape, options)
        reason = _positive(options.xpos_gamma)
        if reason is not None:
            raise ValueError(f"xpos_gamma {reason}, got {options.xpos_gamma}")
        self.scale_base = float(options.xpos_scale_base)
        self.centre = shape.max_positions // 2
        self.register_buffer("decay", xpos_decay(self.rotary_ndims, float(options.xpos_gamma)))

    @classmethod
    def options_problem(cls, options: XposOptions, shape: ModelShape) -> tuple[str, str] | None:
        """Rotary's checks; and no ``proportional`` RoPE, which would rotate channels the decay ζ does not cover."""
        rope_scaling = options.rope_scaling
        if isinstance(rope_scaling, dict) and rope_scaling.get("rope_type") == "proportional":
            return "rope_scaling", "xpos's decay covers the rotary_pct channels only: use another rope_type"
        return super().options_problem(options, shape)

    @classmethod
    def length_problem(cls, options: XposOptions, shape: ModelShape, length: int, dtype: torch.dtype) -> str | None:
        """Positions whose factor ``ζ_0^(∓(t - centre)/B)`` would leave ``dtype``'s range (:func:`xpos_reach`):
        the rotated queries and keys are cast to the compute dtype, where they would overflow to inf."""
        if _positive(options.xpos_gamma) is not None:  # options_problem reports it
            return None
        centre = shape.max_positions // 2
        reach = xpos_reach(dtype, float(options.xpos_gamma), float(options.xpos_scale_base))
        if max(centre, length - 1 - centre) <= reach:
            return None
        longest = centre + reach + 1
        name = str(dtype).removeprefix("torch.")
        fix = ("run in bf16 (fp16: {type: bfloat16}) or fp32, which keep float32's range, or "
               if dtype == torch.float16 else "")
        return (f"xpos scales a key at position t by {1 / (options.xpos_gamma / (1 + options.xpos_gamma)):.3g}^((t - "
                f"{centre})/{options.xpos_scale_base:g}) (centre max_position_embeddings // 2), which leaves {name}'s "
                f"range (with room for keys up to {HEADROOM:g}) past position {longest - 1}; {length} tokens reach "
                f"position {length - 1}: {fix}use at most {longest} tokens")

    def _scale(self, positions: torch.Tensor, sign: float) -> torch.Tensor:
        """``ζ^(sign·(t - centre)/B)`` as float32 ``[s, rotary_ndims]`` (pairs ``c``, ``c + r/2`` share ``ζ_c``)."""
        offsets = positions.to(device=self.decay.device, dtype=torch.float32) - self.centre
        scale = self.decay.float() ** (sign * offsets[:, None] / self.scale_base)  # [s, r/2]
        return torch.cat([scale, scale], dim=-1)

    def rotate(
        self, query: torch.Tensor, key: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate and scale ``query`` by ``ζ^(n/B)`` and ``key`` by ``ζ^(-m/B)`` at absolute positions ``[s]``."""
        return (
            self._rotate_one(query, q_positions, self._scale(q_positions, 1.0)),
            self._rotate_one(key, k_positions, self._scale(k_positions, -1.0)),
        )

    def export_terms(self) -> dict[str, dict[str, Any]]:
        """The ``xpos`` query/key form with the rotary frequencies, the decay, B and the fixed centre."""
        refuse_rope_scaling(self)
        return {"query_key": {"form": "xpos", "inv_freq": {"tensor": "inv_freq"}, "decay": {"tensor": "decay"},
                              "scale_base": self.scale_base, "centre": float(self.centre)}}
