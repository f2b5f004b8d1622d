"""``cable``: Context-Aware Biases for Length Extrapolation (Veisi, Amirzadeh, Mansourian 2025, arXiv
2503.08067).

Each layer turns its own input ``x`` (the attention's input, after ``input_layernorm``) into a
non-positive value per token and head, sums them causally, and adds the difference of the sums to
the scaled logits:

    s_t = Σ_{k <= t} -softplus(W_h · x_k + a_h),     b(i, j) = s_i - s_j  (<= 0 for j <= i),

so the bias decays with the distance at a rate the tokens in between decide: a learned,
token-dependent ALiBi, of the same form as a forgetting gate. ``W [H, hidden]`` and ``a [H]`` belong
to the layer; here they are the rows ``weight[layer]`` and ``bias[layer]`` of the one positional
module (``[num_layers, H, hidden]``, ``[num_layers, H]``), initialised as the authors' code
initialises linear layers (weights N(0, 0.02), biases 0), whose attention also computes ``s`` from
the layer's input with one ``Linear(n_embd, n_head)`` per layer. Unlike that code, the scores here
keep GPT-NeoX's ``1/sqrt(head_dim)`` scale.

The paper's text could not be read where this was written; the formula follows the authors' code
(``axiomlab/Cable``, ``src/Cable.py``). ``s_i`` is constant along a query row, so the softmax would
be the same with ``-s_j`` alone; the term keeps ``s_i - s_j`` (the bias, bounded above by 0). It is a closed form of per-token
tensors: :meth:`Cable.layer_logit_term` returns ``s [b, H, L]`` and a clone of it (read at the query
and at the key: FlexAttention's one-read rule), bound to the layer before it attends; on CUDA,
FlexAttention's backward sends the gradient of both to ``s`` and on to ``W``, ``a`` and ``x``.

Decoding with a KV cache: the cache keeps each layer's ``s`` of the cached tokens beside its keys
(trimmed to the same window); a new chunk continues the running sum from the last of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind
from kerple.positional.logit_term import LogitTerm, ScorePosition, TermFunction

if TYPE_CHECKING:
    from kerple.model.cache import KVCache

INIT_STD = 0.02  # the authors' (nanoGPT's) initialisation of linear weights


def cumulative_biases(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``s [b, H, n]``: causal sums of ``-softplus(W·x_t + a)`` over ``hidden [b, n, h]``, in float32."""
    increments = -F.softplus(F.linear(hidden.float(), weight.float(), bias.float()))  # [b, n, H]
    return increments.cumsum(dim=1).transpose(1, 2)  # [b, H, n]


def cable_term(first: int) -> TermFunction:
    """``s_i - s_j`` reading ``tensors = (s, s_clone)`` ``[b, H, L]`` whose slot 0 is position ``first``."""

    def bias(tensors: tuple[torch.Tensor, ...], position: ScorePosition) -> torch.Tensor:
        at_query, at_key = tensors[0], tensors[1]  # (a softmax temperature appends its 1/τ after them)
        query = torch.clamp(position.query - first, max=at_query.shape[-1] - 1)  # padded query rows (CPU kernel)
        key = torch.clamp(position.key - first, 0, at_key.shape[-1] - 1)  # masked scores may reach outside
        return at_query[position.batch, position.head, query] - at_key[position.batch, position.head, key]

    return bias


class Cable(PositionalEmbedding):
    """CABLE with one ``W, a`` per layer: parameters ``weight [num_layers, H, hidden]`` and
    ``bias [num_layers, H]`` (float32), used by layer ``l`` through :meth:`layer_logit_term`."""

    kind = PositionKind.BIAS
    state_dict_name = "cable"
    learnable = True
    tensor_parallel = False
    tableless_term = True

    def __init__(self, shape: ModelShape) -> None:
        super().__init__(shape)
        if shape.num_layers < 1:
            raise ValueError(f"cable needs num_layers >= 1, got {shape.num_layers}")
        self.num_layers = shape.num_layers
        self.weight = nn.Parameter(torch.randn(shape.num_layers, shape.num_heads, shape.hidden_size) * INIT_STD)
        self.bias = nn.Parameter(torch.zeros(shape.num_layers, shape.num_heads))

    def layer_logit_term(self, layer: int, hidden: torch.Tensor, cache: KVCache | None = None) -> LogitTerm:
        """Layer ``layer``'s term for its input ``hidden [b, n, h]``: ``s_i - s_j`` over the ``n`` new
        tokens and, with ``cache``, the cached ones before them (the cache is extended)."""
        sums = cumulative_biases(hidden, self.weight[layer], self.bias[layer])  # [b, H, n]
        first = 0
        if cache is not None:
            previous = cache.term_values(layer)
            if previous is not None:
                sums = sums + previous[..., -1:]  # continue the running sum
            sums = cache.extend_term_values(layer, sums)  # [b, H, cached + n]
            first = cache.position + hidden.shape[1] - sums.shape[-1]
        return LogitTerm((sums, sums.clone()), bias=cable_term(first))

    def export_terms(self) -> dict[str, dict[str, Any]]:
        """The ``cable`` layer form: each layer's increments from its rows of ``weight`` and ``bias``."""
        return {"layer_bias": {"form": "cable", "weight": {"tensor": "weight"}, "bias": {"tensor": "bias"}}}
