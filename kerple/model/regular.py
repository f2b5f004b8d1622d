"""RegularGPT (thesis ch. 6): Sliding-Dilated-Attention, adaptive depth and weight sharing.

* Sliding-Dilated-Attention (§6.2.1, Eq. 6.1): at level ``l`` every block attends with dilation
  ``C**l`` (:mod:`kerple.model.dilated_attention`), with learnable per-head scalars ``r[h, k]``.
* Adaptive depth (§6.2.2): ``L̄ = ceil(log_C T)`` levels, computed at every forward from the input
  length ``T``, so inputs longer than the training length run more levels.
* Weight sharing with thickness ``K`` (§6.2.2): layer ``l·K + k`` reuses block ``k``; ``K·L̄``
  layers run and the ``K`` blocks are the only layer parameters.

Structure (and ``state_dict()`` names) follow :class:`~kerple.model.GPTModel`: ``embedding``,
``positional`` (the parameter-free ``none`` embedding: RegularGPT's only position information is
``r``), ``layers`` (the ``K`` shared blocks; block ``k``'s scalars are
``layers.<k>.attention.relative_scalars [H, C]``), ``final_norm`` and ``lm_head``. Training,
evaluation and kerple's checkpoints therefore handle it like any other model; a GPT-NeoX or
Hugging Face export is refused (GPT-NeoX has no such layer).

There is no KV cache: a new token can change the depth, and with it every hidden state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kerple.model.dilated_attention import DilatedFlexKernel, adaptive_depth, eager_dilated_attention
from kerple.model.gpt import GPTModel, model_arguments
from kerple.model.mlp import build_norm
from kerple.model.transformer import TokenEmbedding, TransformerLayer
from kerple.positional.absolute import NoPositionalEmbedding

REGULAR_IMPLS: tuple[str, ...] = ("eager", "flex", "auto")
_NO_CACHE = "RegularGPT has no KV cache: its depth ceil(log_C T) changes with the length; generate without a cache"


class DilatedSelfAttention(nn.Module):
    """GPT-NeoX attention projections (``query_key_value`` ``[3h, h]``, ``dense``) with the Eq. 6.1
    mask and the learnable scalars ``relative_scalars [H, C]`` (zeros at initialisation)."""

    def __init__(self, hidden_size: int, num_heads: int, chunk_size: int) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.relative_scalars = nn.Parameter(torch.zeros(num_heads, chunk_size))

    def forward(self, hidden: torch.Tensor, context: RegularContext) -> torch.Tensor:
        """``hidden [b, T, h]`` -> ``[b, T, h]`` (before the residual)."""
        batch, length, width = hidden.shape
        qkv = self.query_key_value(hidden).view(batch, length, self.num_heads, 3 * self.head_dim).transpose(1, 2)
        query, key, value = qkv.split(self.head_dim, dim=-1)  # each [b, H, T, d]
        if context.impl == "flex":
            output = context.flex(query, key, value, self.relative_scalars, context.dilation)
        else:
            output = eager_dilated_attention(query, key, value, self.relative_scalars, context.dilation)
        return self.dense(output.transpose(1, 2).reshape(batch, length, width))


@dataclass(frozen=True)
class RegularContext:
    """What every block of one level needs: the kernel name, the dilation ``C**l``, the flex kernel."""

    impl: str
    dilation: int
    flex: DilatedFlexKernel


class RegularLayer(TransformerLayer):
    """A pre-LN GPT-NeoX layer whose attention is :class:`DilatedSelfAttention`."""

    def __init__(self, *, hidden_size: int, num_heads: int, chunk_size: int, **layer: Any) -> None:
        super().__init__(hidden_size=hidden_size, num_heads=num_heads, layer_index=0, **layer)
        self.attention = DilatedSelfAttention(hidden_size, num_heads, chunk_size)


class RegularGPT(nn.Module):
    """RegularGPT decoder. ``forward(tokens [b, T]) -> logits [b, T, padded_vocab]``.

    ``num_layers`` is the number of shared blocks ``K`` (the thickness); ``depth(T) * K`` layers run.
    """

    lm_head_weight = GPTModel.lm_head_weight
    chunked_loss = GPTModel.chunked_loss
    _init_weights = GPTModel._init_weights  # docs/reference-format.md §4, with the K blocks as the layer count

    def __init__(
        self,
        *,
        chunk_size: int,
        thickness: int,
        hidden_size: int,
        num_attention_heads: int,
        padded_vocab_size: int,
        norm: str = "layernorm",
        layernorm_epsilon: float = 1e-5,
        activation: str = "gelu",
        gpt_j_residual: bool = False,
        no_weight_tying: bool = True,
        hidden_dropout: float = 0.0,
        init_method: str = "normal",
        output_layer_init_method: str = "scaled_normal",
        init_method_std: float = 0.02,
        attention_impl: str = "eager",
        flex_compile: bool = True,
    ) -> None:
        super().__init__()
        if chunk_size < 2 or thickness < 1:
            raise ValueError(f"RegularGPT needs regular_chunk_size >= 2 and regular_thickness >= 1, got {chunk_size}, {thickness}")
        self.chunk_size, self.num_layers = chunk_size, thickness
        self.hidden_size, self.num_heads, self.vocab_size = hidden_size, num_attention_heads, padded_vocab_size
        self.attention_window: int | None = None
        self.embedding = TokenEmbedding(padded_vocab_size, hidden_size, hidden_dropout)
        self.positional = NoPositionalEmbedding(
            num_heads=num_attention_heads, head_dim=hidden_size // num_attention_heads, hidden_size=hidden_size, max_positions=1
        )
        self.layers = nn.ModuleList(
            RegularLayer(
                hidden_size=hidden_size, num_heads=num_attention_heads, chunk_size=chunk_size, norm=norm,
                layernorm_epsilon=layernorm_epsilon, activation=activation, hidden_dropout=hidden_dropout,
                gpt_j_residual=gpt_j_residual,
            )
            for _ in range(thickness)
        )
        self.final_norm = build_norm(norm, hidden_size, layernorm_epsilon)
        self.lm_head = nn.Linear(hidden_size, padded_vocab_size, bias=False) if no_weight_tying else None
        self._flex = DilatedFlexKernel(compile=flex_compile)
        self.attention_impl = "eager"
        self.set_attention(attention_impl)
        self._init_weights(init_method, output_layer_init_method, init_method_std)

    # --- the GPTModel interface used by training, evaluation and generation ----------------
    def set_attention(self, impl: str | None = None, window: int | None | str = "keep") -> None:
        """``eager`` | ``flex`` | ``auto``; an attention window is refused (Eq. 6.1 is the mask)."""
        impl = self.attention_impl if impl is None else impl
        if impl not in REGULAR_IMPLS:
            raise ValueError(f"RegularGPT supports attention_impl {', '.join(REGULAR_IMPLS)}, not {impl!r}")
        if window not in ("keep", None):
            raise ValueError("RegularGPT takes no attention_window: its mask is Sliding-Dilated-Attention (Eq. 6.1)")
        self.attention_impl = impl

    def set_temperature(self, temperature: float) -> None:
        """Only ``1.0``: the softmax temperature of thesis §5.4 belongs to biased attention over long
        contexts; Sliding-Dilated-Attention sees ``C`` keys per query at every length."""
        if temperature != 1.0:
            raise ValueError(f"softmax temperature {temperature:g}: RegularGPT (arch regulargpt) runs at temperature 1 only")

    def resolve_attention_impl(self, device_type: str, training: bool, seq_len: int) -> str:
        """``auto``: flex on CUDA, eager elsewhere; flex training on CPU is refused (no backward)."""
        impl = self.attention_impl
        if impl == "auto":
            impl = "flex" if device_type == "cuda" else "eager"
        if impl == "flex" and training and device_type == "cpu":
            raise ValueError("FlexAttention has no backward on CPU; train RegularGPT with attention_impl: eager")
        return impl

    def new_cache(self, window: int | None = None) -> Any:
        """Refused: RegularGPT has no KV cache (see the module docstring)."""
        raise ValueError(_NO_CACHE)

    def depth(self, length: int) -> int:
        """Levels ``L̄ = ceil(log_C T)`` run for ``length`` tokens (thesis §6.2.2)."""
        return adaptive_depth(length, self.chunk_size)

    def hidden_states(self, tokens: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """Final-normed hidden states ``[b, T, h]``: ``K·L̄`` layers, layer ``l·K + k`` is block ``k``
        with dilation ``C**l``."""
        if cache is not None:
            raise ValueError(_NO_CACHE)
        training = self.training and torch.is_grad_enabled()
        impl = self.resolve_attention_impl(tokens.device.type, training, tokens.shape[1])
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.embedding(tokens, positions, self.positional)  # [b, T, h]
        for level in range(self.depth(tokens.shape[1])):
            context = RegularContext(impl, self.chunk_size**level, self._flex)
            for block in self.layers:
                hidden = block(hidden, context)
        return self.final_norm(hidden)

    def forward(self, tokens: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """``tokens [b, T]`` -> logits ``[b, T, padded_vocab]``."""
        return F.linear(self.hidden_states(tokens, cache), self.lm_head_weight)


def build_regular_model(cfg: Any, *, flex_compile: bool = True) -> RegularGPT:
    """The RegularGPT of ``cfg`` (``model.arch: regulargpt``; ``regular_chunk_size``, ``regular_thickness``)."""
    return RegularGPT(
        **model_arguments(cfg.model),
        chunk_size=cfg.model.regular_chunk_size,
        thickness=cfg.model.regular_thickness,
        attention_impl=cfg.attention.attention_impl,
        flex_compile=flex_compile,
    )
