"""The blocks of :class:`kerple.model.GPTModel`: the token embedding and the transformer layer.

Their submodule names (``word_embeddings``, ``input_layernorm``, ``attention.query_key_value``, ...)
are GPT-NeoX's (docs/reference-format.md §6); where each block's tensors go in a checkpoint is
decided by :mod:`kerple.checkpoint.neox_layout`.
"""

from __future__ import annotations

import torch
from torch import nn

from kerple.model.attention import AttentionContext, SelfAttention
from kerple.model.mlp import MLP, build_norm
from kerple.positional.base import PositionalEmbedding


class TokenEmbedding(nn.Module):
    """Word embeddings ``[V, h]``, the positional embedding's input hook, embedding dropout.

    The positional module is not held here (the model holds it once); it is handed to
    :meth:`forward`, whose ``embed`` hook adds position information (``learned``, ``sinusoidal``)
    or leaves the hidden states as they are (every other kind).
    """

    def __init__(self, vocab_size: int, hidden_size: int, dropout: float) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, positional: PositionalEmbedding) -> torch.Tensor:
        """``tokens [b, s]`` (int64), ``positions [s]`` -> ``[b, s, h]``."""
        hidden = self.word_embeddings(tokens)  # [b, s, h]
        return self.dropout(positional.embed(hidden, positions))


class TransformerLayer(nn.Module):
    """Pre-LN GPT-NeoX layer (docs/reference-format.md §4).

    Sequential residual: ``x = x + drop(attn(ln1(x)))``; ``x = x + drop(mlp(ln2(x)))``.
    ``gpt_j_residual``: ``x = x + drop(attn(ln1(x)) + mlp(ln2(x)))`` (GPT-J parallel form).
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
    ) -> None:
        super().__init__()
        self.gpt_j_residual = gpt_j_residual
        self.input_layernorm = build_norm(norm, hidden_size, layernorm_epsilon)
        self.attention = SelfAttention(hidden_size, num_heads, layer_index)
        self.post_attention_layernorm = build_norm(norm, hidden_size, layernorm_epsilon)
        self.mlp = MLP(hidden_size, activation)
        self.hidden_dropout = nn.Dropout(hidden_dropout)

    def forward(self, hidden: torch.Tensor, context: AttentionContext) -> torch.Tensor:
        """``[b, s, h]`` -> ``[b, s, h]``."""
        attention_out = self.attention(self.input_layernorm(hidden), context)
        if self.gpt_j_residual:
            mlp_out = self.mlp(self.post_attention_layernorm(hidden))
            return hidden + self.hidden_dropout(attention_out + mlp_out)
        hidden = hidden + self.hidden_dropout(attention_out)
        return hidden + self.hidden_dropout(self.mlp(self.post_attention_layernorm(hidden)))
