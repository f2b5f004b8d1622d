"""Dense ``[H, q_len, k_len]`` views of an embedding's distance tables, for the oracle tests."""

from __future__ import annotations

import torch

from kerple.positional.base import PositionalEmbedding, gather_by_distance


def _device(module: PositionalEmbedding) -> torch.device | None:
    tensors = list(module.parameters()) + list(module.buffers())
    return tensors[0].device if tensors else None


def dense_bias(module: PositionalEmbedding, q_len: int, k_len: int) -> torch.Tensor | None:
    """The additive bias on the scaled logits, float32 ``[H, q_len, k_len]``, or ``None``."""
    table, _ = module.distance_tables(k_len, device=_device(module))
    return None if table is None else gather_by_distance(table, q_len, k_len)


def dense_scale(module: PositionalEmbedding, q_len: int, k_len: int) -> torch.Tensor | None:
    """The multiplicative factor on the scaled logits, float32 ``[H, q_len, k_len]``, or ``None``."""
    _, table = module.distance_tables(k_len, device=_device(module))
    return None if table is None else gather_by_distance(table, q_len, k_len)
