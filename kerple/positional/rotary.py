"""``rotary``: rotary position embedding (Su et al. 2021) in GPT-NeoX's layout (docs/reference-format.md §3).

The first ``rotary_ndims = int(head_dim * rotary_pct)`` channels of every query and key are
rotated; the rest pass through. Within the rotated part the "rotate_half" layout pairs channel
``c`` with channel ``c + rotary_ndims/2`` (halves concatenated, not interleaved):

    x' = x * cos(t * θ) + rotate_half(x) * sin(t * θ),   rotate_half([x1, x2]) = [-x2, x1],
    θ = cat(inv_freq, inv_freq),   inv_freq = 1 / base ** (arange(0, rotary_ndims, 2) / rotary_ndims).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kerple.positional.base import PositionalEmbedding, PositionKind
from kerple.positional.options import option


@dataclass(frozen=True)
class RotaryOptions:
    """Options of ``rotary``."""

    rotary_pct: float = option(1.0, "Fraction of each head's dimensions rotated (rotary).", minimum=0.0, maximum=1.0)
    rotary_emb_base: float = option(10000.0, "Base of the rotary frequencies.", minimum=1.0)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (halves concatenated)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class RotaryEmbedding(PositionalEmbedding):
    """Rotary embedding; buffer ``inv_freq`` ``[rotary_ndims/2]`` stored as ``rotary_emb.inv_freq``.

    Rotation is computed in fp32 and cast back to the query dtype (the reference builds its cos/sin
    cache in the compute dtype; fp32 is slightly more accurate in bf16 runs).
    """

    kind = PositionKind.QUERY_KEY
    state_dict_name = "rotary_emb"
    options_class = RotaryOptions

    def __init__(
        self,
        *,
        num_heads: int,
        head_dim: int,
        hidden_size: int,
        max_positions: int,
        options: RotaryOptions = RotaryOptions(),
    ) -> None:
        super().__init__(num_heads=num_heads, head_dim=head_dim, hidden_size=hidden_size, max_positions=max_positions)
        rotary_pct = options.rotary_pct
        if not 0.0 < rotary_pct <= 1.0:
            raise ValueError(f"rotary_pct must be in (0, 1], got {rotary_pct}")
        self.rotary_ndims = int(head_dim * rotary_pct)
        if self.rotary_ndims < 2 or self.rotary_ndims % 2:
            raise ValueError(
                f"rotary dims int(head_dim * rotary_pct) = {self.rotary_ndims} must be even and >= 2 "
                f"(head_dim={head_dim}, rotary_pct={rotary_pct})"
            )
        self.base = float(options.rotary_emb_base)
        exponents = torch.arange(0, self.rotary_ndims, 2, dtype=torch.float32) / self.rotary_ndims
        self.register_buffer("inv_freq", 1.0 / (self.base**exponents))

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.to(device=self.inv_freq.device, dtype=torch.float32)[:, None] * self.inv_freq.float()
        angles = torch.cat([angles, angles], dim=-1)  # [s, rotary_ndims]
        return angles.cos(), angles.sin()

    def _rotate_one(self, x: torch.Tensor, positions: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """The rotated channels of ``x [b, H, s, head_dim]``, each then multiplied by ``scale [s, rotary_ndims]``
        when given (xPos), in float32; the other channels pass through."""
        cos, sin = self._cos_sin(positions)
        rotated, passed = x[..., : self.rotary_ndims], x[..., self.rotary_ndims :]
        rotated = rotated.float()
        rotated = rotated * cos + rotate_half(rotated) * sin  # [b, H, s, rotary_ndims]
        if scale is not None:
            rotated = rotated * scale
        return torch.cat([rotated.to(x.dtype), passed], dim=-1)

    def rotate(
        self, query: torch.Tensor, key: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``query``/``key`` ``[b, H, s, head_dim]`` by their absolute positions ``[s]``."""
        return self._rotate_one(query, q_positions), self._rotate_one(key, k_positions)

    def export_terms(self) -> dict[str, dict[str, Any]]:
        return {"query_key": {"form": "rotary", "inv_freq": {"tensor": "inv_freq"}}}
