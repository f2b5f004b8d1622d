"""The blocks of the decoders: the token embedding and the GPT-NeoX transformer layer.

Their submodule names (``word_embeddings``, ``input_layernorm``, ``attention.query_key_value``, ...)
are GPT-NeoX's (docs/reference-format.md §6); where each block's tensors go in a checkpoint is
decided by :mod:`kerple.checkpoint.neox_layout`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from kerple.model.attention import SelfAttention
from kerple.model.mlp import MLP, build_norm
from kerple.positional.base import PositionalEmbedding


def dropout_module(p: float) -> nn.Module:
    """``nn.Dropout(p)``, or ``nn.Identity`` for ``p == 0`` (the paper's setting), where dropout is the
    identity but would still cost an operator call per use on the host."""
    return nn.Dropout(p) if p > 0.0 else nn.Identity()


class TokenEmbedding(nn.Module):
    """Word embeddings ``[V, h]``, the positional embedding's input hook, embedding dropout.

    The positional module is not held here (the model holds it once); it is handed to
    :meth:`forward`, whose ``embed`` hook adds position information (``learned``, ``sinusoidal``)
    or leaves the hidden states as they are (every other kind, and a family without one).
    """

    def __init__(self, vocab_size: int, hidden_size: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.dropout = dropout_module(dropout)

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor | None = None, positional: PositionalEmbedding | None = None
    ) -> torch.Tensor:
        """``tokens [b, s]`` (int64), ``positions [s]`` -> ``[b, s, h]`` (no ``positional``: word embeddings only)."""
        hidden = self.word_embeddings(tokens)  # [b, s, h]
        if positional is not None:
            hidden = positional.embed(hidden, positions)
        return self.dropout(hidden)


class TransformerLayer(nn.Module):
    """Pre-LN GPT-NeoX layer (docs/reference-format.md §4).

    Sequential residual: ``x = x + drop(attn(ln1(x)))``; ``x = x + drop(mlp(ln2(x)))``.
    ``gpt_j_residual``: ``x = x + drop(attn(ln1(x)) + mlp(ln2(x)))`` (GPT-J parallel form).
    ``attention`` replaces the GPT-NeoX :class:`SelfAttention` (another family's attention with the
    same ``query_key_value``/``dense`` projections, called as ``attention(hidden, context)``).
    """

    def __init__(
        self,
        *,
        hidden_size: int,
        num_heads: int,
        layer_index: int,
        norm: str,
        layernorm_epsilon: float,
        activation: str,
        hidden_dropout: float,
        gpt_j_residual: bool,
        attention: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.gpt_j_residual = gpt_j_residual
        self.input_layernorm = build_norm(norm, hidden_size, layernorm_epsilon)
        self.attention = SelfAttention(hidden_size, num_heads, layer_index) if attention is None else attention
        self.post_attention_layernorm = build_norm(norm, hidden_size, layernorm_epsilon)
        self.mlp = MLP(hidden_size, activation)
        self.hidden_dropout = dropout_module(hidden_dropout)

    def forward(self, hidden: torch.Tensor, context: Any) -> torch.Tensor:
        """``[b, s, h]`` -> ``[b, s, h]`` (``context``: what the attention needs, e.g. an :class:`~kerple.model.attention.AttentionContext`)."""
        attention_out = self.attention(self.input_layernorm(hidden), context)
        if self.gpt_j_residual:
            mlp_out = self.mlp(self.post_attention_layernorm(hidden))
            return hidden + self.hidden_dropout(attention_out + mlp_out)
        hidden = hidden + self.hidden_dropout(attention_out)
        return hidden + self.hidden_dropout(self.mlp(self.post_attention_layernorm(hidden)))


def transformer_layers(
    count: int,
    *,
    hidden_size: int,
    num_heads: int,
    norm: str,
    layernorm_epsilon: float,
    activation: str,
    hidden_dropout: float,
    gpt_j_residual: bool,
    attention: Callable[[int], nn.Module] | None = None,
) -> list[TransformerLayer]:
    """``count`` layers; ``attention(index)`` builds layer ``index``'s attention (default: GPT-NeoX's)."""
    return [
        TransformerLayer(
            hidden_size=hidden_size, num_heads=num_heads, layer_index=index, norm=norm,
            layernorm_epsilon=layernorm_epsilon, activation=activation, hidden_dropout=hidden_dropout,
            gpt_j_residual=gpt_j_residual, attention=None if attention is None else attention(index),
        )
        for index in range(count)
    ]
