"""What every model family's decoder shares (docs/reference-format.md §3-4).

A decoder is a token embedding, a stack of layer modules, a final norm and an LM head, with the
chunked loss evaluation and training use and GPT-NeoX's initialisation. A family (see
:mod:`kerple.model.families`) subclasses :class:`Decoder`, builds its own layers and implements
:meth:`Decoder.hidden_states` and the runtime settings (attention kernel, softmax temperature, KV
cache) it supports; callers ask the family's capabilities, never its name.

``state_dict()`` names: ``embedding`` (:class:`~kerple.model.transformer.TokenEmbedding`),
``positional`` (the one shared positional module, where the family has one), ``layers``
(``nn.ModuleList``), ``final_norm`` and ``lm_head`` (``nn.Linear`` without bias, or ``None`` when
tied to the word embeddings).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from kerple.model.init import init_function
from kerple.model.lm_loss import linear_cross_entropy
from kerple.model.mlp import build_norm
from kerple.model.transformer import TokenEmbedding
from kerple.positional.base import PositionalEmbedding, parameter_statistics


class Decoder(nn.Module):
    """Embedding, layers, final norm and LM head. ``forward(tokens [b, s]) -> logits [b, s, padded_vocab]``."""

    def __init__(
        self,
        *,
        build_layers: Callable[[], Sequence[nn.Module]],
        positional: PositionalEmbedding | None,
        hidden_size: int,
        num_attention_heads: int,
        padded_vocab_size: int,
        norm: str = "layernorm",
        layernorm_epsilon: float = 1e-5,  # the epsilon of whichever ``norm`` is chosen
        no_weight_tying: bool = True,
        hidden_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_attention_heads
        self.vocab_size = padded_vocab_size
        self.embedding = TokenEmbedding(padded_vocab_size, hidden_size, hidden_dropout)
        self.positional = positional
        self.layers = nn.ModuleList(build_layers())
        self.num_layers = len(self.layers)
        self.compiled_layers = False  # set by maybe_compile
        built_for = None if positional is None else positional.num_layers
        if built_for is not None and built_for != self.num_layers:
            raise ValueError(
                f"the positional embedding holds per-layer parameters for {built_for} layer(s) but the model has "
                f"{self.num_layers}; build it with num_layers={self.num_layers}"
            )
        self.final_norm = build_norm(norm, hidden_size, layernorm_epsilon)
        self.lm_head = nn.Linear(hidden_size, padded_vocab_size, bias=False) if no_weight_tying else None

    # --- what a family implements -----------------------------------------------------------
    def hidden_states(self, tokens: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """Final-normed hidden states ``[b, s, h]`` before the LM head."""
        raise NotImplementedError

    def set_attention(self, impl: str | None = None, window: int | None | str = "keep") -> None:
        """Switch the attention kernel (and window, where the family has one); ``ValueError`` if it cannot work."""
        raise NotImplementedError

    def resolve_attention_impl(self, device_type: str, training: bool, seq_len: int) -> str:
        """The kernel a forward of ``seq_len`` tokens would use (``auto`` resolved)."""
        raise NotImplementedError

    def gradient_attention_impl(self, device_type: str, seq_len: int) -> str:
        """A kernel with a backward on ``device_type`` for ``seq_len`` tokens (what ``auto`` trains with)."""
        raise NotImplementedError

    def set_temperature(self, temperature: float) -> None:
        """The softmax temperature τ of thesis §5.4 (``ValueError`` where the family takes none)."""
        raise NotImplementedError

    def positional_parameters(self) -> list[nn.Parameter]:
        """The parameters that carry position information (monitored during training)."""
        raise NotImplementedError

    def shared_parameters(self) -> list[nn.Parameter]:
        """Parameters the forward reads outside the module that owns them (ZeRO-3 registers them)."""
        return [self.lm_head_weight]

    # --- shared -----------------------------------------------------------------------------
    @property
    def lm_head_weight(self) -> torch.Tensor:
        """The LM head's weight ``[V, h]``, or the word embeddings when tied."""
        return self.embedding.word_embeddings.weight if self.lm_head is None else self.lm_head.weight

    def positional_metrics(self) -> dict[str, float]:
        """Mean/std/min/max of every positional parameter, by its name under the model (a family
        with a positional module reports that module's :meth:`~kerple.positional.PositionalEmbedding.metrics`)."""
        if self.positional is not None:
            return self.positional.metrics()
        own = {id(param): name for name, param in self.named_parameters()}
        return parameter_statistics((own[id(param)], param) for param in self.positional_parameters())

    def init_weights(self, init_method: str, output_layer_init_method: str, std: float) -> None:
        """docs/reference-format.md §4: ``init_method`` for weights, ``output_layer_init_method`` for
        the output projections (scaled by the number of layer modules), zero biases, unit norms;
        ``init_method`` also for a learned position table, as GPT-NeoX does."""
        sizes = {"std": std, "num_layers": self.num_layers, "hidden_size": self.hidden_size}
        init_weight = init_function(init_method, **sizes)
        init_output = init_function(output_layer_init_method, **sizes)
        init_weight(self.embedding.word_embeddings.weight)
        if self.positional is not None:
            self.positional.init_input_table(init_weight)
        for layer in self.layers:
            for linear, init in (
                (layer.attention.query_key_value, init_weight),
                (layer.attention.dense, init_output),
                (layer.mlp.dense_h_to_4h, init_weight),
                (layer.mlp.dense_4h_to_h, init_output),
            ):
                init(linear.weight)
                nn.init.zeros_(linear.bias)
            layer.input_layernorm.reset_parameters()
            layer.post_attention_layernorm.reset_parameters()
        self.final_norm.reset_parameters()
        if self.lm_head is not None:
            init_weight(self.lm_head.weight)

    def forward(self, tokens: torch.Tensor, cache: Any = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens [b, s]`` -> logits ``[b, s, padded_vocab]``; with ``labels [b, s]``, the mean cross
        entropy instead (fp32 scalar, -100 ignored), from the LM head fused with the loss
        (:func:`~kerple.model.lm_loss.linear_cross_entropy`: no full-length logits)."""
        hidden = self.hidden_states(tokens, cache)  # [b, s, h]
        if labels is not None:
            return linear_cross_entropy(hidden, self.lm_head_weight, labels, compiled=self.compiled_layers)
        return F.linear(hidden, self.lm_head_weight)

    def chunked_loss(
        self, tokens: torch.Tensor, labels: torch.Tensor, chunk_size: int = 1024, ignore_index: int = -100
    ) -> torch.Tensor:
        """Per-token cross entropy ``[b, s]`` (float32; 0 where ``labels == ignore_index``).

        The LM head and the loss run on ``chunk_size`` positions at a time, so full-length fp32
        logits ``[b, s, V]`` never exist. Under autograd each chunk is recomputed in the
        backward pass (activation checkpointing) so its logits are not kept either.
        """
        hidden = self.hidden_states(tokens)  # [b, s, h]
        weight = self.lm_head_weight
        losses = []
        for start in range(0, tokens.shape[1], chunk_size):
            piece = hidden[:, start : start + chunk_size]
            target = labels[:, start : start + chunk_size]
            if torch.is_grad_enabled() and (piece.requires_grad or weight.requires_grad):
                loss = checkpoint(_chunk_cross_entropy, piece, weight, target, ignore_index, use_reentrant=False)
            else:
                loss = _chunk_cross_entropy(piece, weight, target, ignore_index)
            losses.append(loss)
        return torch.cat(losses, dim=1)


def _chunk_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """``hidden [b, c, h]`` -> per-token loss ``[b, c]`` via fp32 logits of this chunk only."""
    logits = F.linear(hidden, weight).float()  # [b, c, V]
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=ignore_index, reduction="none")
    return loss.view_as(labels)


def maybe_compile(model: Decoder, cfg: Any, backend: str | Callable = "inductor") -> Decoder:
    """Compile each transformer layer in place with ``backend`` when ``cfg.training.compile`` is true;
    returns ``model``.

    Per-layer ``nn.Module.compile`` (as torchtitan does) keeps the parameter names and the
    ``state_dict`` keys unchanged (``torch.compile(model)`` would prefix them with ``_orig_mod.``),
    leaves the Python-side work of a forward (distance tables, KV cache, kernel choice) uncompiled,
    and makes every layer reuse one compiled graph: the layers differ only in their parameters,
    which Dynamo takes as inputs, and in their integer ``layer_index``, which it is told to treat as
    a symbol once it has seen two values (an embedding with per-layer parameters, CABLE, indexes
    them by it; specialised, every layer would compile its own graph and past Dynamo's recompile
    limit of 8 the rest would silently run uncompiled). No layer of any embedding breaks its graph
    (tests/unit/model/test_compiled_layers.py). Call it after moving the model to its device and
    before building the optimizer or a DeepSpeed engine.
    """
    if cfg.training.compile:
        torch._dynamo.config.allow_unspec_int_on_nn_module = True
        for layer in model.layers:
            layer.compile(backend=backend)
        model.compiled_layers = True  # ``auto`` chooses with it (choose_implementation)
    return model


def compile_flex_kernels(model: Decoder, tokens: torch.Tensor, attempts: int = 64) -> int:
    """Under ``training.compile``, settle FlexAttention's kernel options before training: one forward
    and backward on ``tokens [b, s]`` with the layers run uncompiled (the kernel's own ladder chooses
    the options and retries Triton's out-of-resource failures there), then compiled, stepping the
    options down on a failure of the compiled graphs (:meth:`~kerple.model.flex_base.FlexKernel.recover`).
    Returns the number of compiled retries. Nothing of the run changes: the gradient is taken with
    respect to the embedding output only (no ``.grad`` is written) and the RNG state is restored. A
    model without a FlexAttention kernel returns 0 at once. The trainer calls it on CUDA only.
    """
    kernel = getattr(model, "_flex", None)
    if kernel is None:
        return 0
    with uncompiled_layers():
        _forward_backward(model, tokens)
    for retry in range(attempts):
        phase: list[str] = []
        try:
            _forward_backward(model, tokens, phase)
            return retry
        except Exception as error:  # only Triton's out-of-resource failure is retried
            if not kernel.recover(error, phase[-1] if phase else "forward"):
                raise
    raise RuntimeError(f"FlexAttention kernels failed to compile after {attempts} retries")


def uncompiled_layers() -> Any:
    """A context in which compiled modules run their original (eager) code."""
    return torch.compiler.set_stance("force_eager")


def _forward_backward(model: Decoder, tokens: torch.Tensor, phase: list[str] | None = None) -> None:
    """One forward and a backward to the embedding output (no parameter gradient), RNG restored;
    ``phase`` records "forward", then "backward", as the run gets there."""
    phase = [] if phase is None else phase
    embedded: list[torch.Tensor] = []
    handle = model.embedding.register_forward_hook(lambda _module, _inputs, output: embedded.append(output))
    try:
        with torch.random.fork_rng(devices=[tokens.device] if tokens.is_cuda else []), torch.enable_grad():
            phase.append("forward")
            logits = model(tokens)
            phase.append("backward")
            torch.autograd.grad(logits.float().square().mean(), embedded[0])
    finally:
        handle.remove()


def model_arguments(model_cfg: Any) -> dict[str, Any]:
    """The constructor arguments every decoder of this project takes from the ``model`` section
    (sizes, norm, activation, residual form, weight tying, dropout, initialisation)."""
    epsilon = {"rmsnorm": model_cfg.rms_norm_epsilon, "scalenorm": model_cfg.scalenorm_epsilon}.get(
        model_cfg.norm, model_cfg.layernorm_epsilon
    )
    return {
        "hidden_size": model_cfg.hidden_size,
        "num_attention_heads": model_cfg.num_attention_heads,
        "padded_vocab_size": model_cfg.padded_vocab_size,
        "norm": model_cfg.norm,
        "layernorm_epsilon": epsilon,
        "activation": model_cfg.activation,
        "gpt_j_residual": model_cfg.gpt_j_residual,
        "no_weight_tying": model_cfg.no_weight_tying,
        "hidden_dropout": model_cfg.hidden_dropout,
        "init_method": model_cfg.init_method,
        "output_layer_init_method": model_cfg.output_layer_init_method,
        "init_method_std": model_cfg.init_method_std,
    }
