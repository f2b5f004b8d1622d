"""GPT-NeoX language model with a pluggable positional embedding (docs/reference-format.md §3-4).

Structure (and ``state_dict()`` names) as every :class:`~kerple.model.decoder.Decoder`:
``embedding``, ``positional`` (the ONE positional module, shared by all layers:
docs/reference-format.md §2), ``layers`` (:class:`TransformerLayer`), ``final_norm`` and
``lm_head``. The model knows nothing of how checkpoints store it: GPT-NeoX's ``sequential.<N>`` names, their index
gaps and the per-layer copies of the positional tensors are :mod:`kerple.checkpoint.neox_layout`'s.

The distance tables (and, for ``flex`` or an embedding without tables, the embedding's closed-form
logit term) are computed ONCE per forward and handed to every layer in an
:class:`~kerple.model.attention.AttentionContext`; a term of each layer's input (CABLE) is computed
by the layer through the context's layer hook.

Activation checkpointing (``checkpoint_activations``, ``checkpoint_num_layers`` = N): in a training
forward with autograd on and no KV cache, each group of N transformer layers runs under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` and is recomputed in the backward
pass (dropout replays the same RNG state). The numbers are unchanged: the recomputation runs the
same operations on the same inputs, and the shared positional tables reach every group as inputs
of the recomputed graph, so their parameters receive the same gradients.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from kerple import positional as positional_registry
from kerple.model.attention import AUTO, AttentionContext, choose_implementation, unsupported_reason
from kerple.model.cache import KVCache
from kerple.model.decoder import Decoder, model_arguments
from kerple.model.family import ModelFamily
from kerple.model.flex import FlexAttentionKernel
from kerple.model.transformer import TransformerLayer, transformer_layers
from kerple.positional.base import PositionalEmbedding


class GPTModel(Decoder):
    """GPT-NeoX decoder. ``forward(tokens [b, s]) -> logits [b, s, padded_vocab]``.

    ``attention_impl`` and ``attention_window`` are plain attributes read at every forward (set
    them through :meth:`set_attention` to have the combination validated), so evaluation can switch
    kernels or windows on a trained model. ``attention_impl == "auto"`` is resolved at every
    forward by :func:`~kerple.model.attention.choose_implementation` from the device, the mode and
    the length (see :meth:`resolve_attention_impl`).
    """

    def __init__(
        self,
        *,
        num_layers: int,
        hidden_size: int,
        num_attention_heads: int,
        padded_vocab_size: int,
        positional: PositionalEmbedding,
        norm: str = "layernorm",
        layernorm_epsilon: float = 1e-5,  # the epsilon of whichever ``norm`` is chosen
        activation: str = "gelu",
        gpt_j_residual: bool = False,
        no_weight_tying: bool = True,
        hidden_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        init_method: str = "normal",
        output_layer_init_method: str = "scaled_normal",
        init_method_std: float = 0.02,
        attention_impl: str = "eager",
        attention_window: int | None = None,
        flex_compile: bool = True,
        checkpoint_activations: bool = False,
        checkpoint_num_layers: int = 1,
    ) -> None:
        if int(checkpoint_num_layers) < 1:
            raise ValueError(f"checkpoint_num_layers must be >= 1, got {checkpoint_num_layers}")

        layer = {"hidden_size": hidden_size, "num_heads": num_attention_heads, "norm": norm, "activation": activation,
                 "layernorm_epsilon": layernorm_epsilon, "hidden_dropout": hidden_dropout, "gpt_j_residual": gpt_j_residual}
        super().__init__(
            build_layers=lambda: transformer_layers(num_layers, **layer), positional=positional, hidden_size=hidden_size,
            num_attention_heads=num_attention_heads, padded_vocab_size=padded_vocab_size, norm=norm,
            layernorm_epsilon=layernorm_epsilon, no_weight_tying=no_weight_tying, hidden_dropout=hidden_dropout,
        )
        # plain attributes read at every forward (see the class docstring)
        self.checkpoint_activations = bool(checkpoint_activations)
        self.checkpoint_num_layers = int(checkpoint_num_layers)
        self.attention_dropout = attention_dropout
        self._flex = FlexAttentionKernel(compile=flex_compile)
        self.attention_impl = "eager"
        self.attention_window: int | None = None
        self.softmax_temperature = 1.0  # τ of thesis §5.4, a runtime setting (see set_temperature)
        self.set_attention(attention_impl, attention_window)
        self.init_weights(init_method, output_layer_init_method, init_method_std)

    # --- runtime settings -------------------------------------------------------------------
    def set_attention(self, impl: str | None = None, window: int | None | str = "keep") -> None:
        """Switch the attention kernel and/or window; raises ``ValueError`` for a combination that cannot work.

        ``window="keep"`` leaves the window unchanged; ``None`` removes it. Refusals that depend on
        the device or on training (flex backward on CPU) are checked at every forward instead.
        """
        impl = self.attention_impl if impl is None else impl
        reason = None if impl == AUTO else unsupported_reason(
            impl, self.positional.kind, "cuda", training=False
        )
        if reason is not None:
            raise ValueError(reason)
        if window != "keep":
            if window is not None and int(window) < 1:
                raise ValueError(f"attention_window must be >= 1 or None, got {window}")
            self.attention_window = None if window is None else int(window)
        self.attention_impl = impl

    def set_temperature(self, temperature: float) -> None:
        """Divide every attention layer's logits (after the bias) by ``temperature`` (thesis §5.4);
        1.0 restores the trained model. Raises ``ValueError`` unless ``temperature > 0``."""
        if not temperature > 0.0:
            raise ValueError(f"softmax temperature must be > 0, got {temperature}")
        self.softmax_temperature = float(temperature)

    def resolve_attention_impl(self, device_type: str, training: bool, seq_len: int) -> str:
        """The kernel a forward of ``seq_len`` keys would use: ``attention_impl``, or the choice of ``auto``."""
        if self.attention_impl != AUTO:
            return self.attention_impl
        return self._auto(device_type, training, seq_len)

    def gradient_attention_impl(self, device_type: str, seq_len: int) -> str:
        """What ``auto`` trains with on ``device_type`` (a kernel with a backward there)."""
        return self._auto(device_type, True, seq_len)

    def _auto(self, device_type: str, training: bool, seq_len: int) -> str:
        return choose_implementation(
            self.positional.kind,
            device_type,
            training,
            seq_len,
            window=self.attention_window,
            dropout_p=self.attention_dropout,
            flex_compiled=self._flex.compiled,
            compiled_layers=self.compiled_layers,
            learnable=any(p.requires_grad for p in self.positional.parameters()),
        )

    def positional_parameters(self) -> list[nn.Parameter]:
        """The shared positional module's parameters."""
        return list(self.positional.parameters())

    def shared_parameters(self) -> list[nn.Parameter]:
        """The positional parameters (every layer reads the distance tables) and the LM-head weight."""
        return [*self.positional.parameters(), self.lm_head_weight]

    def new_cache(self, window: int | None = None) -> KVCache:
        """An empty :class:`KVCache` for incremental decoding (``window``: keep only the last W keys)."""
        return KVCache(self.num_layers, window)

    # --- forward ----------------------------------------------------------------------------
    def attention_context(self, q_len: int, device: torch.device, cache: KVCache | None = None) -> AttentionContext:
        """Distance tables (once per forward), positions and mask settings for every layer."""
        start = 0 if cache is None else cache.position
        k_len = q_len + (0 if cache is None else cache.cached_length)
        window = self.attention_window
        if cache is not None and cache.window is not None:
            window = cache.window if window is None else min(window, cache.window)
        training = self.training and torch.is_grad_enabled()
        impl = self.resolve_attention_impl(device.type, training, k_len)
        reason = unsupported_reason(impl, self.positional.kind, device.type, training)
        if reason is not None:
            raise ValueError(reason)
        bias_table, scale_table = self.positional.distance_tables(k_len, device=device)
        temperature = self.softmax_temperature
        if bias_table is not None and temperature != 1.0:
            bias_table = bias_table / temperature
        no_tables = bias_table is None and scale_table is None  # then every kernel reads the closed form
        wants_term = no_tables or (impl == "flex" and self._flex.closed_form)
        logit_term = self.positional.logit_term() if wants_term else None
        if logit_term is not None:
            logit_term = logit_term.divide_bias(temperature)
        learnable = any(table is not None and table.requires_grad for table in (bias_table, scale_table))
        separate = impl == "flex" and training and self._flex.separate_gradient and q_len == k_len and learnable
        return AttentionContext(
            impl=impl,
            q_len=q_len,
            k_len=k_len,
            q_positions=torch.arange(start, start + q_len, device=device),
            rotate=self.positional.rotate,
            bias_table=None if bias_table is None else bias_table.float(),  # [H, k_len]
            scale_table=None if scale_table is None else scale_table.float(),  # [H, k_len]
            window=window,
            dropout_p=self.attention_dropout,
            cache=cache,
            flex=self._flex,
            logit_term=logit_term,
            temperature=temperature,
            layer_term=self.positional.layer_logit_term,
            separate_gradient=separate,
        )

    def checkpoint_group(self, cache: KVCache | None = None) -> int | None:
        """Layers per activation-checkpoint group for the forward about to run, or ``None`` (no
        checkpointing: switched off, evaluation, no autograd, or incremental decoding)."""
        if self.checkpoint_activations and cache is None and self.training and torch.is_grad_enabled():
            return self.checkpoint_num_layers
        return None

    def hidden_states(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Final-normed hidden states ``[b, s, h]`` before the LM head.

        With ``cache``, ``tokens`` continue the sequence held in the cache (positions start at
        ``cache.position``) and the cache is extended and advanced.
        """
        context = self.attention_context(tokens.shape[1], tokens.device, cache)
        hidden = self.embedding(tokens, context.q_positions, self.positional)  # [b, s, h]
        hidden = run_layers(self.layers, hidden, context, self.checkpoint_group(cache))
        if cache is not None:
            cache.advance(tokens.shape[1])
        return self.final_norm(hidden)


def run_layers(
    layers: Sequence[TransformerLayer], hidden: torch.Tensor, context: AttentionContext, group: int | None = None
) -> torch.Tensor:
    """``hidden [b, s, h]`` through ``layers`` in order; with ``group`` = N, every N consecutive
    layers run as one activation-checkpoint group (recomputed in the backward pass)."""
    if not group:
        for layer in layers:
            hidden = layer(hidden, context)
        return hidden
    for start in range(0, len(layers), group):
        hidden = checkpoint(_run_group, layers[start : start + group], hidden, context, use_reentrant=False)
    return hidden


def _run_group(layers: Sequence[TransformerLayer], hidden: torch.Tensor, context: AttentionContext) -> torch.Tensor:
    """One checkpointed group: ``layers`` on a copy of ``context`` with an empty cache of dense views.

    The context gathers its dense ``[H, q, k]`` bias/mask views lazily and keeps them; a fresh
    cache makes the forward and its recomputation build (and save) exactly the same tensors.
    """
    return run_layers(layers, hidden, dataclasses.replace(context, _dense={}))


def build_gpt(cfg: Any, *, flex_compile: bool = True) -> GPTModel:
    """The GPT-NeoX decoder of ``cfg`` (a :class:`kerple.config.Config`; uses ``cfg.model``,
    ``cfg.positional``, ``cfg.attention`` and ``cfg.training``) with its positional embedding from
    the registry."""
    model_cfg, positional_cfg, attention_cfg, training_cfg = cfg.model, cfg.positional, cfg.attention, cfg.training
    positional = positional_registry.build(
        positional_cfg.pos_emb,
        num_heads=model_cfg.num_attention_heads,
        head_dim=model_cfg.head_dim,
        hidden_size=model_cfg.hidden_size,
        max_positions=model_cfg.max_position_embeddings or model_cfg.seq_length,
        num_layers=model_cfg.num_layers,
        **positional_cfg.options(),
    )
    return GPTModel(
        **model_arguments(model_cfg),
        num_layers=model_cfg.num_layers,
        positional=positional,
        attention_dropout=model_cfg.attention_dropout,
        attention_impl=attention_cfg.attention_impl,
        attention_window=attention_cfg.attention_window,
        flex_compile=flex_compile,
        checkpoint_activations=training_cfg.checkpoint_activations,
        checkpoint_num_layers=training_cfg.checkpoint_num_layers,
    )


FAMILY = ModelFamily(
    name="gpt",
    summary="the GPT-NeoX decoder with any pos_emb of the positional registry",
    build=build_gpt,
    layer_count_key="num_layers",
    positional_embedding=True,
    attention_impls=("eager", "sdpa", "flex", "triton", "auto"),
    attention_window=True,
    kv_cache=True,
    softmax_temperature=True,
    tensor_parallel=True,
    pipeline_parallel=True,
    recorded_args=(),
    neox_export=True,
    hf_export="by positional embedding (docs/interop.md)",
)
