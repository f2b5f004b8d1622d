"""Self-attention of GPT-NeoX with interchangeable kernels: ``eager`` | ``sdpa`` | ``flex`` | ``triton``.

Reference order of operations (docs/reference-format.md §3):

1. ``query_key_value`` is one fused linear ``[3h, h]`` whose output is viewed as
   ``[b, s, heads, 3 * head_dim]``: rows are interleaved **per head** (q, k, v of head 0, then of
   head 1, ...), as in Hugging Face's GPTNeoX.
2. The positional embedding's ``rotate`` hook acts on q and k (a no-op for non-rotary embeddings).
3. ``scores = q·kᵀ / sqrt(head_dim)``.
4. ``scores = scores * logit_scale + bias`` from the embedding's per-head distance tables, or from
   its closed form evaluated at the forward's positions when it has no tables (FIRE, a function of
   the query position too; CABLE, computed by each layer from its input).
5. Causal mask (plus the optional attention window of thesis §4.3.3: query ``i`` sees key ``j`` only
   when ``0 <= i - j < W``), softmax, attention dropout, ``probs @ v``, ``dense``.

A softmax temperature τ (thesis §5.4, Algorithm 1: ``Softmax_τ(l) = softmax(l / τ)`` with ``l`` the
logits after the bias) divides step 4's result. Every kernel gets it the same way, without a
change of its own: the query is divided by τ after the rotation and the model divides the distance
tables' bias by τ (``AttentionContext.temperature`` records τ), so ``(q·kᵀ/√d · s + b)/τ`` holds.

The four kernels compute the same function (tests check agreement to 1e-5 in fp32):

* ``eager`` restates the reference math with scores and softmax in fp32; the dense
  ``[H, q, k]`` bias/scale are gathered from the distance tables (or evaluated from the closed form
  on the grid of positions, ``[b or 1, H, q, k]``).
* ``sdpa`` calls ``torch.nn.functional.scaled_dot_product_attention`` with a materialized additive
  float mask (bias + causal/window mask, in the query's dtype); on CPU in fp32/fp64 without dropout
  it calls the fused CPU flash kernel directly, with a backward that also differentiates the mask
  (``sdpa_cpu.py``), when the mask is a Toeplitz matrix of distance tables; a mask from a closed form
  goes to PyTorch's own kernel choice, among those that return a mask's gradient when it needs one.
  A multiplicative logit scale (KERPLE weight kernels, paper
  §5.3) cannot be expressed there, so that combination is refused.
* ``flex`` calls FlexAttention with a ``score_mod`` that computes the embedding's closed form from
  per-head tensors, or, for an embedding without one, indexes the ``[H, k_len]`` tables by distance
  (no ``L×L`` tensor either way), and a cached ``BlockMask`` for causal/window masking (see
  ``flex.py``). In training, a distance-based learnable term goes to the kernel detached and its
  parameters' gradient is summed tile by tile apart (``bias_gradient.py``).
* ``triton`` (opt-in, never chosen by ``auto``: not yet timed on a GPU) is one fused FlashAttention-2 kernel
  with the distance tables in its logits, whose backward also returns the tables' gradient
  (``triton_attention.py``); it runs on CUDA, or in Triton's CPU interpreter for the tests.

The layer never names an embedding: it only asks whether a table or a closed form is ``None``, and
hands its input to :meth:`AttentionContext.for_layer` (the embedding's layer hook) before attending.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from kerple.model import sdpa_cpu, triton_attention
from kerple.positional.base import PositionKind, diagonal_gather, gather_by_distance
from kerple.positional.logit_term import LogitTerm, ScorePosition, distance_table_term

if TYPE_CHECKING:
    from kerple.model.cache import KVCache
    from kerple.model.flex import FlexAttentionKernel

ATTENTION_IMPLS: tuple[str, ...] = ("eager", "sdpa", "flex", "triton")
SUGGESTED_IMPLS: tuple[str, ...] = ("eager", "sdpa", "flex")  # what a refusal proposes: the measured kernels
AUTO = "auto"  # resolved per forward by :func:`choose_implementation`

# Where ``auto`` switches to FlexAttention: the shortest sequence length from which it picks ``flex``, per
# (device, training, kind of term); ``None``: never (on CUDA an attention window still asks for flex).
# Each row says what it rests on; ``benchmarks/long_context.py --impls flex,sdpa`` prints the tokens/s
# and peak memory of both per length, and its rows are what the CUDA numbers should be set from.
#
# * CPU evaluation, 2048: compiled flex is faster than sdpa at every length measured on CPU
#   (benchmarks/eval_memory.py: 3.4x at 2048 tokens, with 1/20 of the memory), but each new length costs
#   a compilation of ~10-30 s; below 2048 the L² work is too small to pay that back.
# * CPU training, never: FlexAttention has no CPU backward; sdpa_cpu's blockwise backward, which sums the
#   bias gradient along diagonals, took 1.06x of ``none`` against 1.54x for the flash backward plus the
#   separate reduction (benchmarks/bias_gradient.py, 4 x 4 x 512 x 32 fp32, 1 thread, 2026-11-27).
# * CUDA training of a bias, 8192. Measured at 512 tokens (H200, 162M, bf16, compile off,
#   docs/gpu-report.md): kerple_log 169,552 tokens/s through sdpa's dense bias against 58,682 through flex
#   when FlexAttention's backward scattered the gradient; alibi, with no gradient at all, 160,136 through
#   flex against 212,509 through sdpa; kerple_log through flex with the separate reduction of per-head
#   Jacobians 157,670 against 252,867 through sdpa (docs/flex-attention.md §5). ASSUMED until measured:
#   the reduction's tables' path (kerple/model/bias_gradient.py) trains no faster than alibi through flex
#   at 512, so sdpa stays below 8192 tokens; from 8192 the dense [H, L, L] bias and its gradient (1.6 GB in bf16 and 3.2 GB in fp32
#   at 12 heads) make O(L) memory the deciding cost. Measured since with the tables' Triton reduction
#   (H200, compile off): kerple_log 250,287 tokens/s through sdpa against 169,688 through flex at 512.
# * CUDA training of a learnable bias in compiled layers, flex at every length: through compiled sdpa,
#   kerple_log's fp32 master weights stayed exactly as they were over 11 steps (H200, torch 2.11, the GPU
#   check's step 4; eager sdpa and compiled flex trained them), and compiled flex ran as fast as eager
#   sdpa (249,890 against 250,287 tokens/s). The trainer also stops at the first step when a positional
#   parameter gets no gradient (kerple/training/gradient_check.py). Since then sdpa keeps cuDNN's
#   attention, which returns no mask gradient, away from a mask that needs one (MASK_GRADIENT_KERNELS),
#   the suspected cause; this row stays until the CUDA test of test_compiled_layers.py passes.
# * CUDA, weight kernels and evaluation of any logit term: flex from the start (the only kernel that
#   scales the logits; O(L) memory in evaluation).
FLEX_FROM_LENGTH: dict[tuple[str, bool, PositionKind], int | None] = {
    ("cpu", False, PositionKind.BIAS): 2048,
    ("cpu", False, PositionKind.WEIGHT): 2048,
    ("cpu", False, PositionKind.NONE): 2048,
    ("cpu", False, PositionKind.INPUT): 2048,
    ("cpu", False, PositionKind.QUERY_KEY): 2048,
    ("cuda", True, PositionKind.BIAS): 8192,
    ("cuda", True, PositionKind.WEIGHT): 0,
    ("cuda", False, PositionKind.BIAS): 0,
    ("cuda", False, PositionKind.WEIGHT): 0,
}
CPU_FLEX_MIN_LENGTH = FLEX_FROM_LENGTH[("cpu", False, PositionKind.BIAS)]
CUDA_TRAIN_FLEX_MIN_LENGTH = FLEX_FROM_LENGTH[("cuda", True, PositionKind.BIAS)]

RotateFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
LayerTermFn = Callable[[int, torch.Tensor, "KVCache | None"], "LogitTerm | None"]


def unsupported_reason(impl: str, kind: PositionKind | str, device_type: str, training: bool) -> str | None:
    """Why ``impl`` cannot serve an embedding of ``kind`` on ``device_type``; ``None`` if it can.

    Whether the embedding is learnable does not matter: every kernel with a backward also
    differentiates the distance tables.
    """
    kind = PositionKind(kind)
    if impl not in ATTENTION_IMPLS:
        return f"unknown attention_impl {impl!r}; choose one of {', '.join(ATTENTION_IMPLS)}"
    reason = _limitation(impl, kind, device_type, training)
    if reason is None:
        return None
    # only what serves this embedding here: a weight kernel's sdpa on a CPU once suggested flex, which
    # CPU training refuses
    usable = [other for other in SUGGESTED_IMPLS if other not in (impl, "auto")
              and _limitation(other, kind, device_type, training) is None]
    return f"{reason}; use attention_impl: {' or '.join(usable + ['auto'])}"


def _limitation(impl: str, kind: PositionKind, device_type: str, training: bool) -> str | None:
    """What keeps ``impl`` from serving ``kind`` here, without the alternatives."""
    if impl == "sdpa" and kind == PositionKind.WEIGHT:
        return ("a weight kernel multiplies the attention logits (scores * logit_scale + bias), which "
                "scaled_dot_product_attention cannot express as an additive mask")
    if impl == "flex" and training and device_type == "cpu":
        return "FlexAttention has no backward on CPU (it serves evaluation there)"
    if impl == "triton" and not triton_attention.runs_on(device_type):
        return ("the Triton attention kernel needs CUDA and the triton package (on a CPU it runs only in "
                "Triton's interpreter, TRITON_INTERPRET=1, for tests)")
    return None


def choose_implementation(
    kind: PositionKind | str,
    device_type: str,
    training: bool,
    seq_len: int,
    *,
    window: int | None = None,
    dropout_p: float = 0.0,
    flex_compiled: bool = True,
    compiled_layers: bool = False,
    learnable: bool = False,
) -> str:
    """The fastest implementation that can serve an embedding of ``kind`` here (``attention_impl: auto``).

    Choice table (first matching row wins; ``position-only`` = kinds ``none``, ``input``,
    ``query_key``, i.e. no logit term; ``logit term`` = ``bias`` and ``weight``):

    ======  ==========  ==================================  ==========================================
    device  mode        embedding                           choice
    ======  ==========  ==================================  ==========================================
    cuda    train/eval  position-only, no window            ``sdpa`` (flash/efficient kernel, causal)
    cuda    train       bias, no window, ``seq_len <        ``sdpa`` (dense bias; see
                        CUDA_TRAIN_FLEX_MIN_LENGTH``        :data:`FLEX_FROM_LENGTH` for what it rests on)
    cuda    train       learnable bias, compiled layers     ``flex`` (compiled sdpa left its parameters
                                                            untrained: :data:`FLEX_FROM_LENGTH`'s notes)
    cuda    train/eval  logit term, or any with a window    ``flex`` (tables in ``score_mod``,
                                                            block-sparse causal/window mask)
    cpu     train       bias / position-only                ``sdpa`` (FlexAttention has no CPU
                                                            backward)
    cpu     train       weight (multiplicative scale)       ``eager`` (sdpa cannot scale the logits)
    cpu     eval        ``seq_len >= CPU_FLEX_MIN_LENGTH``  ``flex`` (O(H·L) memory, compiled)
    cpu     eval        shorter, bias / position-only       ``sdpa``
    cpu     eval        shorter, weight                     ``eager``
    ======  ==========  ==================================  ==========================================

    ``compiled_layers``: the decoder layers run under ``torch.compile`` (:func:`~kerple.model.decoder.maybe_compile`);
    ``learnable``: the embedding has trainable parameters (for a bias, the term's). Overrides: training with ``dropout_p > 0`` never picks ``flex`` (no attention dropout there),
    and ``flex_compiled=False`` (the unfused reference FlexAttention, which materializes the
    scores) never picks ``flex``; ``sdpa`` then ``eager`` take its place. Every returned choice
    passes :func:`unsupported_reason`. Other devices follow the CPU rows.
    """
    kind = PositionKind(kind)
    flex_allowed = flex_compiled and not (training and dropout_p > 0.0)
    table_device = "cuda" if device_type == "cuda" else "cpu"
    shortest = FLEX_FROM_LENGTH.get((table_device, training, kind))
    wants_flex = (shortest is not None and seq_len >= shortest) or (device_type == "cuda" and window is not None)
    learnable_bias = kind == PositionKind.BIAS and learnable  # trained through the attention kernel's mask
    wants_flex = wants_flex or (device_type == "cuda" and training and compiled_layers and learnable_bias)
    candidates = ("flex", "sdpa", "eager") if wants_flex and flex_allowed else ("sdpa", "eager")
    for impl in candidates:
        if unsupported_reason(impl, kind, device_type, training) is None:
            return impl
    return "eager"


@dataclass
class AttentionContext:
    """Everything a layer's attention needs for one forward, built once by the model.

    ``bias_table`` / ``scale_table`` are the embedding's float32 ``[H, k_len]`` distance tables
    (``None`` when it has no such term). Keys are contiguous positions ending at the last query, so
    query row ``i`` and key column ``j`` are at distance ``i - j + (k_len - q_len)``. The dense
    ``[H, q_len, k_len]`` views used by eager/sdpa are gathered lazily, once per forward.
    ``logit_term`` is the embedding's closed form for ``flex`` (its bias already divided by τ), or
    ``None``: ``flex`` then gathers the tables. ``separate_gradient``: in ``flex`` training of a
    distance-based learnable term, the kernel runs the term detached and the tables' gradient comes
    apart (:mod:`kerple.model.bias_gradient`), carried by autograd to the parameters. An
    embedding without tables has its closed form here for every kernel (:attr:`grid_term`): eager/sdpa
    evaluate it on the grid of absolute positions (:meth:`score_grid`). ``layer_term`` is the embedding's layer hook
    (:meth:`for_layer`).
    """

    impl: str
    q_len: int
    k_len: int
    q_positions: torch.Tensor  # [q_len] absolute positions of the new tokens
    rotate: RotateFn
    bias_table: torch.Tensor | None = None  # [H, k_len]
    scale_table: torch.Tensor | None = None  # [H, k_len]
    window: int | None = None
    dropout_p: float = 0.0
    cache: KVCache | None = None
    flex: FlexAttentionKernel | None = None
    logit_term: LogitTerm | None = None
    temperature: float = 1.0  # softmax temperature τ; the bias table is already divided by it
    layer_term: LayerTermFn | None = None
    separate_gradient: bool = False  # flex training: the tables' gradient apart
    _dense: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def for_layer(self, layer: int, hidden: torch.Tensor) -> AttentionContext:
        """The context layer ``layer`` attends with: this one, or, where the embedding computes the term
        from the layer's input ``hidden [b, n, h]`` (CABLE), a copy holding that term (bias divided by τ)."""
        term = None if self.layer_term is None else self.layer_term(layer, hidden, self.cache)
        if term is None:
            return self
        return dataclasses.replace(self, logit_term=term.divide_bias(self.temperature), _dense={})

    @property
    def grid_term(self) -> LogitTerm | None:
        """The closed form eager/sdpa evaluate on the grid of positions: the term of an embedding
        without distance tables (``None`` when there are tables, or no term)."""
        return self.logit_term if self.bias_table is None and self.scale_table is None else None

    def score_grid(self, batch: int, heads: int) -> ScorePosition:
        """Every score of ``[batch, heads, q_len, k_len]`` as broadcastable indices at absolute positions
        (keys are the ``k_len`` positions ending at the last query)."""
        device = self.q_positions.device
        keys = self.q_positions[-1] + 1 - self.k_len + torch.arange(self.k_len, device=device)
        return ScorePosition(
            batch=torch.arange(batch, device=device)[:, None, None, None],
            head=torch.arange(heads, device=device)[None, :, None, None],
            query=self.q_positions[None, None, :, None],
            key=keys[None, None, None, :],
        )

    def allowed(self) -> torch.Tensor:
        """Bool ``[q_len, k_len]``: key ``j`` is visible to query ``i`` (causal and within the window)."""
        if "allowed" not in self._dense:
            query = torch.arange(self.k_len - self.q_len, self.k_len, device=self.q_positions.device)[:, None]
            key = torch.arange(self.k_len, device=self.q_positions.device)[None, :]
            signed = query - key  # [q, k]
            allowed = signed >= 0
            if self.window is not None:
                allowed = allowed & (signed < self.window)
            self._dense["allowed"] = allowed
        return self._dense["allowed"]

    def blocked(self) -> torch.Tensor:
        """Bool ``[q_len, k_len]``, the complement of :meth:`allowed` (made once per forward, not per layer)."""
        if "blocked" not in self._dense:
            self._dense["blocked"] = ~self.allowed()
        return self._dense["blocked"]

    def flex_term(self, dtype: torch.dtype) -> LogitTerm | None:
        """The term ``flex`` applies: the closed form, else a gather from the tables cast to ``dtype``."""
        if self.logit_term is not None:
            return self.logit_term
        return distance_table_term(self.bias_table, self.scale_table, dtype)

    def dense_bias(self, batch: int = 1, heads: int = 1) -> torch.Tensor | None:
        """Additive bias, float32: ``[H, q_len, k_len]`` gathered from ``bias_table``, or the grid term's
        ``[batch or 1, heads, q_len, k_len]``; ``None`` when there is none."""
        if self.bias_table is not None:
            if "bias" not in self._dense:
                self._dense["bias"] = gather_by_distance(self.bias_table, self.q_len, self.k_len)
            return self._dense["bias"]
        return self._grid_values("bias", batch, heads)

    def dense_scale(self, batch: int = 1, heads: int = 1) -> torch.Tensor | None:
        """Logit scale, float32, as :meth:`dense_bias` (from ``scale_table`` or the grid term); or ``None``."""
        if self.scale_table is not None:
            if "scale" not in self._dense:
                self._dense["scale"] = gather_by_distance(self.scale_table, self.q_len, self.k_len)
            return self._dense["scale"]
        return self._grid_values("scale", batch, heads)

    def _grid_values(self, which: str, batch: int, heads: int) -> torch.Tensor | None:
        """The grid term's ``bias`` or ``scale`` on :meth:`score_grid`, float32, once per context."""
        term = self.grid_term
        function = None if term is None else getattr(term, which)
        if function is None:
            return None
        key = f"grid_{which}"
        if key not in self._dense:
            values = function(term.tensors, self.score_grid(batch, heads)).float()
            self._dense[key] = values.expand(-1, heads, self.q_len, self.k_len)  # [b or 1, H, q, k]
        return self._dense[key]

    def grid_mask(self, dtype: torch.dtype, batch: int, heads: int) -> torch.Tensor:
        """SDPA's additive mask from the grid term: its bias, ``-inf`` where a key is not visible,
        ``[b or 1, H, q_len, k_len]`` in ``dtype`` (its gradient reaches the term's tensors)."""
        bias = self.dense_bias(batch, heads)
        return bias.masked_fill(self.blocked(), float("-inf")).to(dtype)

    def sdpa_diagonals(self) -> torch.Tensor | None:
        """The SDPA mask's value per diagonal, ``[H or 1, q_len + k_len - 1]`` float32 (index
        ``d + q_len - 1`` for distance ``d = i - j + k_len - q_len``): the bias table, ``-inf`` beyond
        the window and above the causal diagonal; ``None`` when plain causal attention suffices."""
        if self.bias_table is None and self.window is None and self.q_len == self.k_len:
            return None  # SDPA's own is_causal path
        if "diagonals" not in self._dense:
            device = self.q_positions.device
            table = self.bias_table if self.bias_table is not None else torch.zeros(1, self.k_len, device=device)
            if self.window is not None:  # [H|1, k]: distance d visible only when d < window
                beyond = torch.arange(self.k_len, device=device) >= self.window
                table = table.masked_fill(beyond, float("-inf"))
            above = table.new_full((table.shape[0], self.q_len - 1), float("-inf"))  # distances 1-q .. -1
            self._dense["diagonals"] = torch.cat([above, table], dim=-1)  # [H|1, q + k - 1]
        return self._dense["diagonals"]

    def sdpa_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive float mask ``[1, H or 1, q_len, k_len]`` for SDPA; ``None`` when plain causal suffices.

        Bias plus ``-inf`` where a key is not visible. Every entry depends on the distance alone, so
        the mask is gathered in one pass from :meth:`sdpa_diagonals`, and its gradient reaches the
        table as sums along the diagonals (:func:`~kerple.positional.base.diagonal_gather`).
        """
        diagonals = self.sdpa_diagonals()
        if diagonals is None:
            return None
        key = f"sdpa_mask_{dtype}"
        if key not in self._dense:
            self._dense[key] = diagonal_gather(diagonals, self.q_len, self.k_len).to(dtype)[None]
        return self._dense[key]


def eager_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, context: AttentionContext, training: bool
) -> torch.Tensor:
    """Reference math: fp32 ``scores * scale + bias``, causal/window mask, fp32 softmax, dropout.

    ``query [b, H, q, d]``, ``key``/``value [b, H, k, d]`` -> ``[b, H, q, d]`` in ``value``'s dtype.
    """
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2))  # [b, H, q, k]
    scores = scores * (1.0 / math.sqrt(query.shape[-1]))
    batch, heads = query.shape[:2]
    scale = context.dense_scale(batch, heads)
    if scale is not None:
        scores = scores * scale  # [H, q, k] or [b or 1, H, q, k], broadcast over b
    bias = context.dense_bias(batch, heads)
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(context.blocked(), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)  # [b, H, q, k]
    if training and context.dropout_p > 0.0:
        probs = F.dropout(probs, p=context.dropout_p)
    return torch.matmul(probs, value)  # [b, H, q, d]


MASK_GRADIENT_KERNELS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""The ``scaled_dot_product_attention`` kernels that return their mask's gradient. cuDNN's backward
returns none (``_scaled_dot_product_cudnn_attention_backward`` gives dq, dk, dv), and recent PyTorch
tries it first on sm90 and newer; flash attention takes no mask."""


def _sdpa_masked(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                 dropout_p: float) -> torch.Tensor:
    """PyTorch's sdpa with an additive ``mask``; a mask that needs a gradient only reaches the
    kernels that return it (:data:`MASK_GRADIENT_KERNELS`)."""
    with sdpa_kernel(MASK_GRADIENT_KERNELS) if mask.requires_grad else contextlib.nullcontext():
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)


def sdpa_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, context: AttentionContext, training: bool
) -> torch.Tensor:
    """``scaled_dot_product_attention`` with a materialized additive mask (bias + causal/window)."""
    if context.scale_table is not None:
        raise ValueError(unsupported_reason("sdpa", PositionKind.WEIGHT, query.device.type, training))
    dropout_p = context.dropout_p if training else 0.0
    if context.grid_term is not None:  # not a Toeplitz mask: PyTorch's kernel differentiates it
        return _sdpa_masked(query, key, value, context.grid_mask(query.dtype, *query.shape[:2]), dropout_p)
    mask = context.sdpa_mask(query.dtype)
    if mask is None:
        return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, is_causal=True)
    if sdpa_cpu.supported(query, dropout_p):  # fused forward, the gradient straight to the diagonals
        diagonals = context.sdpa_diagonals()
        learnable = diagonals if diagonals.requires_grad else None
        return sdpa_cpu.masked_attention(query, key, value, mask.detach(), learnable, context.window)
    return _sdpa_masked(query, key, value, mask, dropout_p)


def flex_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, context: AttentionContext, training: bool
) -> torch.Tensor:
    """FlexAttention with the positional term in ``score_mod`` (no ``L×L`` tensor); cached decoding
    goes to eager.

    Incremental decoding (``q_len < k_len``) changes the shapes every step, which would recompile
    the fused kernel each time; there the per-row bias is only ``[H, q_len, k_len]``, so the eager
    kernel is used instead.
    """
    if context.q_len != context.k_len:
        return eager_attention(query, key, value, context, training)
    if training and context.dropout_p > 0.0:
        raise ValueError("attention_impl flex does not implement attention dropout; set attention_dropout: 0")
    if context.flex is None:
        raise ValueError("attention_impl flex needs a FlexAttentionKernel in the attention context")
    tables = (context.bias_table, context.scale_table) if context.separate_gradient else None
    return context.flex(query, key, value, context.flex_term(query.dtype), context.window, tables)


def fused_triton_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, context: AttentionContext, training: bool
) -> torch.Tensor:
    """The fused Triton kernel with the distance tables in its logits (``triton_attention.py``); cached
    decoding (``q_len < k_len``) goes to eager, as in :func:`flex_attention`."""
    if context.q_len != context.k_len:
        return eager_attention(query, key, value, context, training)
    if training and context.dropout_p > 0.0:
        raise ValueError("attention_impl triton does not implement attention dropout; set attention_dropout: 0")
    if context.grid_term is not None:
        raise ValueError("attention_impl triton reads distance tables, and this embedding's term is a closed form "
                         "of the positions (no tables); use attention_impl: flex or sdpa")
    output, _ = triton_attention.fused_attention(query, key, value, context.bias_table, context.scale_table,
                                                 context.window)
    return output  # [b, H, s, d]


KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
    "flex": flex_attention,
    "triton": fused_triton_attention,
}


class SelfAttention(nn.Module):
    """GPT-NeoX attention block: fused ``query_key_value`` ``[3h, h]`` and output ``dense`` ``[h, h]``.

    The shared positional module belongs to the model, not to this block: this class only uses the
    hooks handed over in :class:`AttentionContext`.
    """

    def __init__(self, hidden_size: int, num_heads: int, layer_index: int) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.layer_index = layer_index
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: torch.Tensor, context: AttentionContext) -> torch.Tensor:
        """``hidden [b, s, h]`` -> ``[b, s, h]`` (before the residual)."""
        context = context.for_layer(self.layer_index, hidden)  # a term of this layer's input, if any
        batch, seq, _ = hidden.shape
        qkv = self.query_key_value(hidden)  # [b, s, 3h]
        qkv = qkv.view(batch, seq, self.num_heads, 3 * self.head_dim).transpose(1, 2)  # [b, H, s, 3d]
        query, key, value = qkv.split(self.head_dim, dim=-1)  # each [b, H, s, d]
        query, key = context.rotate(query, key, context.q_positions, context.q_positions)
        if context.temperature != 1.0:
            query = query / context.temperature  # (q·kᵀ/√d · s + b)/τ; b/τ is in the bias table
        if context.cache is not None:
            key, value = context.cache.extend(self.layer_index, key, value)  # [b, H, k_len, d]
        output = KERNELS[context.impl](query, key, value, context, self.training)  # [b, H, s, d]
        output = output.transpose(1, 2).reshape(batch, seq, self.hidden_size)  # [b, s, h]
        return self.dense(output)
