"""The pipeline stages of GPT-NeoX, named as in the reference checkpoints (docs/reference-format.md §6).

``GPTModel.sequential`` holds, by pipeline index ``N``:
``0`` :class:`EmbeddingStage`, ``2 .. L+1`` :class:`TransformerLayer`, ``L+3`` :class:`FinalNormStage`,
``L+4`` :class:`LMHeadStage` (untied head only). Indices 1 and L+2 are the reference's
parameter-free stages and have no module.
"""

from __future__ import annotations

import torch
from torch import nn

from kerple.model.attention import AttentionContext, SelfAttention
from kerple.model.mlp import MLP, build_norm
from kerple.positional.base import PositionalEmbedding


class EmbeddingStage(nn.Module):
    """Stage 0: ``word_embeddings`` ``[V, h]``, the input positional hook, embedding dropout.

    An input-kind embedding (``learned``, ``sinusoidal``) is *adopted*: its submodules and
    parameters are registered directly here, so the learned table's key is
    ``sequential.0.position_embeddings.weight`` as in the reference's layer-0 file.
    """

    def __init__(self, vocab_size: int, hidden_size: int, dropout: float, positional: PositionalEmbedding | None) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self._embed = positional.embed if positional is not None else None
        if positional is not None:
            if any(True for _ in positional.named_buffers(recurse=False)):
                raise ValueError(
                    f"{type(positional).__name__}: an input embedding must keep its buffers in submodules "
                    "so they can be adopted by the embedding stage"
                )
            for name, child in positional.named_children():
                self.add_module(name, child)
            for name, param in positional.named_parameters(recurse=False):
                self.register_parameter(name, param)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``tokens [b, s]`` (int64), ``positions [s]`` -> ``[b, s, h]``."""
        hidden = self.word_embeddings(tokens)  # [b, s, h]
        if self._embed is not None:
            hidden = self._embed(hidden, positions)
        return self.dropout(hidden)


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


class FinalNormStage(nn.Module):
    """Stage L+3: the final ``norm`` (key ``norm.{weight,bias}``)."""

    def __init__(self, norm: str, hidden_size: int, layernorm_epsilon: float) -> None:
        super().__init__()
        self.norm = build_norm(norm, hidden_size, layernorm_epsilon)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)


class LMHeadStage(nn.Module):
    """Stage L+4: the untied LM head ``final_linear`` ``[V, h]`` without bias."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.final_linear = nn.Linear(hidden_size, vocab_size, bias=False)
