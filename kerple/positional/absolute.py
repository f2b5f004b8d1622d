"""Absolute embeddings added to the token embeddings: ``none``, ``learned``, ``sinusoidal``.

References: NoPE (thesis ch. 2, no position information); the learned table and the sinusoidal
embedding of GPT-NeoX (docs/reference-format.md §3; Vaswani et al. 2017 §3.5).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind


class NoPositionalEmbedding(PositionalEmbedding):
    """``none``: no explicit position information (NoPE, thesis ch. 2); every hook is a no-op.

    Causal attention alone still lets the model infer positions (thesis Part I).
    """

    kind = PositionKind.NONE

    def export_terms(self) -> dict[str, dict[str, Any]]:
        return {}


def _check_positions(positions: torch.Tensor, max_positions: int, name: str) -> None:
    """Raise a clear ``ValueError`` for positions outside ``[0, max_positions)``."""
    if positions.numel() == 0:
        return
    low, high = int(positions.min()), int(positions.max())
    if low < 0 or high >= max_positions:
        raise ValueError(
            f"{name} positional embedding covers positions 0..{max_positions - 1} "
            f"(max_position_embeddings={max_positions}) but got positions {low}..{high}; "
            "a learned absolute table cannot extrapolate: raise max_position_embeddings or "
            "pick a relative embedding"
        )


class LearnedPositionalEmbedding(PositionalEmbedding):
    """``learned``: a trained table ``nn.Embedding(max_positions, hidden_size)``, init N(0, 0.02) here
    and, in a model, with the model's ``init_method`` (:meth:`init_input_table`), as GPT-NeoX does.

    The submodule is named ``position_embeddings`` so its tensor is ``position_embeddings.weight``,
    the reference's layer-0 key (docs/reference-format.md §6). It lives at the input, hence
    ``state_dict_name = None``. The table follows the model's dtype like the word embeddings
    (``keep_fp32 = False``).
    """

    kind = PositionKind.INPUT
    learnable = True
    keep_fp32 = False

    def __init__(self, shape: ModelShape) -> None:
        super().__init__(shape)
        self.position_embeddings = nn.Embedding(shape.max_positions, shape.hidden_size)
        nn.init.normal_(self.position_embeddings.weight, mean=0.0, std=0.02)

    def init_input_table(self, init: Callable[[torch.Tensor], torch.Tensor]) -> None:
        init(self.position_embeddings.weight)

    def embed(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``hidden [b, s, h] + table[positions]``; raises ``ValueError`` beyond ``max_positions``."""
        _check_positions(positions, self.max_positions, "learned")
        table = self.position_embeddings(positions)  # [s, h]
        return hidden + table.to(hidden.dtype)

    def export_terms(self) -> dict[str, dict[str, Any]]:
        return {"input": {"form": "learned", "table": {"tensor": "position_embeddings.weight"}}}


def sinusoidal_table(positions: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """``cat(sin(t * inv_freq), cos(t * inv_freq))`` as float32 ``[*positions.shape, hidden_size]``.

    ``inv_freq = 1 / 10000 ** (arange(0, h, 2) / h)`` (docs/reference-format.md §3): the reference's layout puts
    all sines first and all cosines second rather than interleaving them as Vaswani et al. do.
    """
    if hidden_size % 2:
        raise ValueError(f"sinusoidal embedding needs an even hidden size, got {hidden_size}")
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hidden_size, 2, device=positions.device, dtype=torch.float32) / hidden_size))
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [..., h/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # [..., h]


class SinusoidalPositionalEmbedding(PositionalEmbedding):
    """``sinusoidal``: fixed sin/cos embedding added to the token embeddings (docs/reference-format.md §3).

    No tensors are stored (the reference has no checkpoint key for it); the table is computed in
    fp32 for the requested positions, so any position works.
    """

    kind = PositionKind.INPUT

    def __init__(self, shape: ModelShape) -> None:
        super().__init__(shape)
        if shape.hidden_size % 2:
            raise ValueError(f"sinusoidal embedding needs an even hidden size, got {shape.hidden_size}")

    def embed(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``hidden [b, s, h] + cat(sin, cos)[positions]``."""
        return hidden + sinusoidal_table(positions, self.hidden_size).to(hidden.dtype)

    def export_terms(self) -> dict[str, dict[str, Any]]:
        return {"input": {"form": "sinusoidal"}}
