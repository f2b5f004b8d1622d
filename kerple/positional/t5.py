"""``rpe`` (alias ``t5``): T5 relative position bias, causal buckets (Raffel et al. 2020).

KERPLE paper §4 ("Connection to Prior Work") and docs/reference-format.md §3: a learned scalar per (bucket,
head); distances below ``num_buckets/2`` get their own bucket, larger ones share log-spaced
buckets up to ``max_distance``:

    bucket(d) = d                                                    if d < 16
              = min(31, 16 + floor(log(d/16) / log(128/16) * 16))    otherwise

(for the defaults 32 buckets / 128). The looked-up value is multiplied by ``sqrt(head_dim)``
because the bias is added to the *scaled* logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind
from kerple.positional.options import option


def t5_causal_bucket(distance: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """Bucket index (int64, same shape) of each causal distance ``d >= 0``.

    The log branch is evaluated in float32 and truncated, as the reference does, so bucket
    boundaries match its checkpoints; distances below ``max_exact`` are clamped up before the log
    only to avoid ``log(0)`` in the branch that ``where`` discards.
    """
    max_exact = num_buckets // 2
    distance = distance.long().clamp(min=0)
    scaled = distance.clamp(min=max_exact).float() / max_exact
    log_bucket = max_exact + (torch.log(scaled) / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return torch.where(distance < max_exact, distance, log_bucket)


@dataclass(frozen=True)
class T5Options:
    """Options of ``rpe`` (T5 bias)."""

    rpe_num_buckets: int = option(32, "T5 relative-position buckets.", minimum=2)
    rpe_max_distance: int = option(128, "T5 distance beyond which buckets saturate.", minimum=1)


class T5RelativeBias(PositionalEmbedding):
    """T5 bias: parameter ``weight`` ``[num_buckets, H]`` (``rpe.weight``), bias = ``weight[bucket(d), h] * sqrt(head_dim)``.

    Init xavier_normal over the full ``[num_buckets, total_heads]`` matrix, i.e. std
    ``sqrt(2 / (num_buckets + total_heads))``, so a tensor-parallel slice is initialised like the
    reference's split master weight. Only the bucket index vector is cached.
    """

    kind = PositionKind.BIAS
    state_dict_name = "rpe"
    learnable = True
    options_class = T5Options

    def __init__(self, shape: ModelShape, options: T5Options = T5Options()) -> None:
        super().__init__(shape)
        shape.head_indices()  # validates the slice
        rpe_num_buckets, rpe_max_distance = options.rpe_num_buckets, options.rpe_max_distance
        if rpe_num_buckets < 2 or rpe_max_distance <= rpe_num_buckets // 2:
            raise ValueError(
                f"need rpe_num_buckets >= 2 and rpe_max_distance > rpe_num_buckets/2, "
                f"got {rpe_num_buckets}, {rpe_max_distance}"
            )
        self.num_buckets = rpe_num_buckets
        self.max_distance = rpe_max_distance
        self.scale = math.sqrt(shape.head_dim)
        std = math.sqrt(2.0 / (rpe_num_buckets + shape.all_heads))
        self.weight = nn.Parameter(torch.randn(rpe_num_buckets, shape.num_heads) * std)
        self._bucket_cache: tuple[int, torch.device, torch.Tensor] | None = None

    def buckets(self, k_len: int, device: torch.device | None = None) -> torch.Tensor:
        """Bucket index of distances ``0..k_len-1`` (int64 ``[k_len]``), cached per (k_len, device)."""
        device = torch.device(device) if device is not None else self.weight.device
        cache = self._bucket_cache
        if cache is None or cache[0] != k_len or cache[1] != device:
            distance = torch.arange(k_len, device=device)
            cache = (k_len, device, t5_causal_bucket(distance, self.num_buckets, self.max_distance))
            self._bucket_cache = cache
        return cache[2]

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``weight[bucket(d)].T * sqrt(head_dim)`` float32 ``[H, k_len]``; no scale table."""
        buckets = self.buckets(k_len, device)
        table = self.weight.float().to(buckets.device)[buckets]  # [k_len, H]
        return table.transpose(0, 1) * self.scale, None

    def export_terms(self) -> dict[str, dict[str, Any]]:
        bucket = {"num_buckets": self.num_buckets, "max_distance": self.max_distance, "scale": self.scale}
        return {"bias": {"form": "bucket", "table": {"tensor": "weight"}, **bucket}}
