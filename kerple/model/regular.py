"""RegularGPT (thesis ch. 6): Sliding-Dilated-Attention, visible padding, adaptive depth, weight sharing.

* Sliding-Dilated-Attention (§6.2.1, Eq. 6.1): at level ``l`` every block attends with dilation
  ``C**l``, with learnable per-head scalars ``r[h, k]`` (:mod:`kerple.positional.dilated`).
* Padding (§6.2.1, footnote 1): the input is read as if preceded by PAD tokens. Every layer's input
  is ``[pad, x_0, ..., x_{T-1}]``; slot 0 carries the state of a learned PAD embedding
  (``pad_embedding [h]``) through the same blocks, and a query's key before position 0 is that
  state (see :mod:`kerple.positional.dilated` for why leaving such keys out breaks Parity Check, and
  how this equals physical left-padding with PAD tokens).
  ``regular_padding: none`` keeps the earlier reading (absent keys left out), which RegularGPT
  checkpoints written before padding hold.
* Adaptive depth (§6.2.2): ``L̄ = ceil(log_C T)`` levels, computed at every forward from the input
  length ``T``, so inputs longer than the training length run more levels.
* Weight sharing with thickness ``K`` (§6.2.2): layer ``l·K + k`` reuses block ``k``; ``K·L̄``
  layers run and the ``K`` blocks are the only layer parameters.

``state_dict()`` names follow :class:`~kerple.model.decoder.Decoder`: ``embedding``, ``layers``
(the ``K`` shared blocks; block ``k``'s scalars are ``layers.<k>.attention.relative_scalars
[H, C]``), ``final_norm``, ``lm_head``, and ``pad_embedding`` when padding is on. There is no
shared positional module (``positional`` is ``None``): Eq. 6.1's scalars are each block's own.

There is no KV cache: a new token can change the depth, and with it every hidden state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kerple.model.decoder import Decoder, model_arguments
from kerple.model.dilated_attention import DilatedFlexKernel, adaptive_depth, eager_dilated_attention
from kerple.model.family import ModelFamily
from kerple.model.transformer import transformer_layers

REGULAR_IMPLS: tuple[str, ...] = ("eager", "flex", "auto")
PADDINGS: tuple[str, ...] = ("pad", "none")
_NO_CACHE = "RegularGPT has no KV cache: its depth ceil(log_C T) changes with the length; generate without a cache"


@dataclass(frozen=True)
class RegularContext:
    """What every block of one level needs: the kernel name, the dilation ``C**l``, whether the
    pad slot is visible, the flex kernel."""

    impl: str
    dilation: int
    padded: bool
    flex: DilatedFlexKernel


class DilatedSelfAttention(nn.Module):
    """GPT-NeoX attention projections (``query_key_value`` ``[3h, h]``, ``dense``) with the Eq. 6.1
    term and the learnable scalars ``relative_scalars [H, C]`` (zeros at initialisation)."""

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
        """``hidden [b, 1 + T, h]`` (slot 0 = the pad) -> ``[b, 1 + T, h]`` (before the residual)."""
        batch, slots, width = hidden.shape
        qkv = self.query_key_value(hidden).view(batch, slots, self.num_heads, 3 * self.head_dim).transpose(1, 2)
        query, key, value = qkv.split(self.head_dim, dim=-1)  # each [b, H, 1 + T, d]
        kernel = context.flex if context.impl == "flex" else eager_dilated_attention
        output = kernel(query, key, value, self.relative_scalars, context.dilation, context.padded)
        return self.dense(output.transpose(1, 2).reshape(batch, slots, width))


class RegularGPT(Decoder):
    """RegularGPT decoder. ``forward(tokens [b, T]) -> logits [b, T, padded_vocab]``.

    ``num_layers`` is the number of shared blocks ``K`` (the thickness); ``depth(T) * K`` layers run.
    """

    def __init__(
        self,
        *,
        chunk_size: int,
        thickness: int,
        hidden_size: int,
        num_attention_heads: int,
        padded_vocab_size: int,
        padding: str = "pad",
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
        if chunk_size < 2 or thickness < 1:
            raise ValueError(f"RegularGPT needs regular_chunk_size >= 2 and regular_thickness >= 1, got {chunk_size}, {thickness}")
        if padding not in PADDINGS:
            raise ValueError(f"regular_padding {padding!r}: choose one of {', '.join(PADDINGS)}")

        layer = {"hidden_size": hidden_size, "num_heads": num_attention_heads, "norm": norm, "activation": activation,
                 "layernorm_epsilon": layernorm_epsilon, "hidden_dropout": hidden_dropout, "gpt_j_residual": gpt_j_residual}

        def dilated(block: int) -> DilatedSelfAttention:
            return DilatedSelfAttention(hidden_size, num_attention_heads, chunk_size)

        super().__init__(
            build_layers=lambda: transformer_layers(thickness, attention=dilated, **layer), positional=None, hidden_size=hidden_size,
            num_attention_heads=num_attention_heads, padded_vocab_size=padded_vocab_size, norm=norm,
            layernorm_epsilon=layernorm_epsilon, no_weight_tying=no_weight_tying, hidden_dropout=hidden_dropout,
        )
        self.chunk_size = chunk_size
        self.padding = padding
        self.pad_embedding = nn.Parameter(torch.empty(hidden_size)) if padding == "pad" else None
        self._flex = DilatedFlexKernel(compile=flex_compile)
        self.attention_impl = "eager"
        self.set_attention(attention_impl)
        self.init_weights(init_method, output_layer_init_method, init_method_std)

    def init_weights(self, init_method: str, output_layer_init_method: str, std: float) -> None:
        """The decoder's initialisation (the ``K`` blocks as the layer count); the PAD embedding as a word embedding."""
        super().init_weights(init_method, output_layer_init_method, std)
        if self.pad_embedding is not None:
            nn.init.normal_(self.pad_embedding, mean=0.0, std=std)

    # --- runtime settings -------------------------------------------------------------------
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
        impl = self.gradient_attention_impl(device_type, seq_len) if self.attention_impl == "auto" else self.attention_impl
        if impl == "flex" and training and device_type == "cpu":
            raise ValueError("FlexAttention has no backward on CPU; train RegularGPT with attention_impl: eager")
        return impl

    def gradient_attention_impl(self, device_type: str, seq_len: int) -> str:
        """Flex on CUDA, eager elsewhere (both have a backward there)."""
        return "flex" if device_type == "cuda" else "eager"

    def positional_parameters(self) -> list[nn.Parameter]:
        """Each block's Eq. 6.1 scalars ``r [H, C]``."""
        return [block.attention.relative_scalars for block in self.layers]

    def new_cache(self, window: int | None = None) -> Any:
        """Refused: RegularGPT has no KV cache (see the module docstring)."""
        raise ValueError(_NO_CACHE)

    # --- forward ----------------------------------------------------------------------------
    def depth(self, length: int) -> int:
        """Levels ``L̄ = ceil(log_C T)`` run for ``length`` tokens (thesis §6.2.2)."""
        return adaptive_depth(length, self.chunk_size)

    def pad_state(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        """Slot 0 of the first layer's input ``[b, 1, h]``: the PAD embedding (after the embedding
        dropout), or zeros when padding is off (the slot is then never attended to)."""
        if self.pad_embedding is None:
            return like.new_zeros(batch, 1, like.shape[-1])
        return self.embedding.dropout(self.pad_embedding.to(like.dtype)).expand(batch, 1, -1)

    def hidden_states(self, tokens: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """Final-normed hidden states ``[b, T, h]``: ``K·L̄`` layers over ``[pad, x_0, ..., x_{T-1}]``,
        layer ``l·K + k`` is block ``k`` with dilation ``C**l``."""
        if cache is not None:
            raise ValueError(_NO_CACHE)
        training = self.training and torch.is_grad_enabled()
        impl = self.resolve_attention_impl(tokens.device.type, training, tokens.shape[1])
        embedded = self.embedding(tokens)  # [b, T, h]
        hidden = torch.cat([self.pad_state(tokens.shape[0], embedded), embedded], dim=1)  # [b, 1 + T, h]
        for level in range(self.depth(tokens.shape[1])):
            context = RegularContext(impl, self.chunk_size**level, self.pad_embedding is not None, self._flex)
            for block in self.layers:
                hidden = block(hidden, context)
        return self.final_norm(hidden[:, 1:])


def build_regular_model(cfg: Any, *, flex_compile: bool = True) -> RegularGPT:
    """The RegularGPT of ``cfg`` (``model.arch: regulargpt``; ``regular_chunk_size``,
    ``regular_thickness``, ``regular_padding``)."""
    return RegularGPT(
        **model_arguments(cfg.model),
        chunk_size=cfg.model.regular_chunk_size,
        thickness=cfg.model.regular_thickness,
        padding=cfg.model.regular_padding,
        attention_impl=cfg.attention.attention_impl,
        flex_compile=flex_compile,
    )


FAMILY = ModelFamily(
    name="regulargpt",
    summary="RegularGPT (thesis ch. 6): Sliding-Dilated-Attention with adaptive depth and shared blocks",
    build=build_regular_model,
    layer_count_key="regular_thickness",
    positional_embedding=False,
    attention_impls=REGULAR_IMPLS,
    attention_window=False,
    kv_cache=False,
    softmax_temperature=False,
    tensor_parallel=False,
    pipeline_parallel=False,
    recorded_args=("arch", "regular_chunk_size", "regular_thickness", "regular_padding"),
    legacy_args={"regular_padding": "none"},
    neox_export=False,
    hf_export=None,
)
