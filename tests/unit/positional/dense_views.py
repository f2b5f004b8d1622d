"""Dense ``[H, q_len, k_len]`` views of the term an embedding adds to the scaled logits, for the
oracle and contract tests: gathered from its distance tables, or, for an embedding without tables,
its closed form evaluated at absolute positions (FIRE), or layer 0's term for a fixed input (CABLE)."""

from __future__ import annotations

import torch

from kerple.positional.base import PositionalEmbedding, gather_by_distance
from kerple.positional.logit_term import LogitTerm, ScorePosition

MAX_LENGTH = 64


def _device(module: PositionalEmbedding) -> torch.device | None:
    tensors = list(module.parameters()) + list(module.buffers())
    return tensors[0].device if tensors else None


def layer_input(module: PositionalEmbedding, k_len: int) -> torch.Tensor:
    """A fixed input ``[1, k_len, hidden]`` for layer terms: a prefix of one ``MAX_LENGTH``-token sequence."""
    generator = torch.Generator().manual_seed(7)
    full = torch.randn(1, MAX_LENGTH, module.hidden_size, generator=generator)
    return full[:, :k_len].to(_device(module))


def grid(heads: int, q_len: int, k_len: int, device: torch.device | None = None) -> ScorePosition:
    """Every score of ``[H, q_len, k_len]``; query row ``i`` sits at absolute position ``k - q + i``."""
    return ScorePosition(
        batch=torch.zeros((), dtype=torch.long, device=device),
        head=torch.arange(heads, device=device)[:, None, None],
        query=torch.arange(k_len - q_len, k_len, device=device)[None, :, None],
        key=torch.arange(k_len, device=device)[None, None, :],
    )


def term_without_tables(module: PositionalEmbedding, k_len: int) -> LogitTerm | None:
    """The closed form of an embedding without distance tables (or layer 0's term for :func:`layer_input`)."""
    term = module.logit_term()
    if term is None:
        term = module.layer_logit_term(0, layer_input(module, k_len))
    return term


def _dense(module: PositionalEmbedding, q_len: int, k_len: int, which: int) -> torch.Tensor | None:
    tables = module.distance_tables(k_len, device=_device(module))
    if any(table is not None for table in tables):
        table = tables[which]
        return None if table is None else gather_by_distance(table, q_len, k_len)
    term = term_without_tables(module, k_len)
    function = None if term is None else (term.bias, term.scale)[which]
    if function is None:
        return None
    values = function(term.tensors, grid(module.num_heads, q_len, k_len, _device(module)))
    return values.float().expand(module.num_heads, q_len, k_len)


def dense_bias(module: PositionalEmbedding, q_len: int, k_len: int) -> torch.Tensor | None:
    """The additive bias on the scaled logits, float32 ``[H, q_len, k_len]``, or ``None``."""
    return _dense(module, q_len, k_len, 0)


def dense_scale(module: PositionalEmbedding, q_len: int, k_len: int) -> torch.Tensor | None:
    """The multiplicative factor on the scaled logits, float32 ``[H, q_len, k_len]``, or ``None``."""
    return _dense(module, q_len, k_len, 1)
