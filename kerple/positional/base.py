"""The positional-embedding plug-in contract.

A positional embedding can act in three places:

* on the token embeddings (``learned``, ``sinusoidal``): :meth:`PositionalEmbedding.embed`;
* on queries and keys (``rotary``): :meth:`PositionalEmbedding.rotate`;
* on the *scaled* attention logits (ALiBi, T5, KERPLE, Sandwich, Gaussian-like kernels):
  an additive bias and, for the weight kernels of KERPLE §5.3 / Appendix A.3, a multiplicative
  logit scale, ``new_scores = scores * logit_scale + bias`` (reference order, docs/reference-format.md §3).

Most logit terms are functions of the causal distance ``d = i - j >= 0`` between query position
``i`` and key position ``j`` only. Such an embedding describes itself with per-head *distance
tables* of length ``k_len`` (O(H·L) memory), from which the dense ``[H, q_len, k_len]`` matrices are
gathered for the eager / sdpa paths. Tables are built once per forward and shared by all layers.

Fused kernels (FlexAttention) take the term as a :class:`~kerple.positional.logit_term.LogitTerm`
evaluated per score inside the kernel: the *closed form* an embedding returns from
:meth:`PositionalEmbedding.logit_term` (computed from small per-head tensors), or, for an embedding
without one (T5 buckets, Sandwich), a gather from its distance tables.

Two later kinds of term have no distance tables, and eager / sdpa evaluate their closed form on the
grid of the forward's positions instead: a term of the query position as well as the distance (FIRE:
:meth:`~PositionalEmbedding.logit_term` alone), and a term of each layer's input (CABLE:
:meth:`~PositionalEmbedding.layer_logit_term`, which every layer calls with its input before it
attends; its parameters may be per layer, ``num_layers`` of them).

The transformer layer never names an embedding: it asks for these hooks and nothing else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch import nn

from kerple.positional.logit_term import LogitTerm

if TYPE_CHECKING:
    from kerple.model.cache import KVCache


def parameter_statistics(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
    """``name/mean``, ``name/std``, ``name/min``, ``name/max`` of every tensor (training logs)."""
    stats: dict[str, float] = {}
    for name, param in named:
        values = param.detach().float().flatten()
        stats[f"{name}/mean"] = values.mean().item()
        stats[f"{name}/std"] = values.std().item() if values.numel() > 1 else 0.0
        stats[f"{name}/min"] = values.min().item()
        stats[f"{name}/max"] = values.max().item()
    return stats


class PositionKind(str, enum.Enum):
    """Where an embedding acts; used by the model to skip work, never to branch on names."""

    NONE = "none"  # no position information (NoPE)
    INPUT = "input"  # added to the token embeddings
    QUERY_KEY = "query_key"  # rotates queries and keys
    BIAS = "bias"  # additive term on the scaled logits
    WEIGHT = "weight"  # multiplicative logit scale (optionally plus an additive bias)


def causal_distances(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Distance matrix ``d[i, j] = (k_len - q_len + i) - j`` clamped at 0, as int64 ``[q_len, k_len]``.

    Query row ``i`` is absolute position ``k_len - q_len + i``; key column ``j`` is position ``j``.
    Entries above the diagonal (``j`` after the query) are masked by attention, so they are clamped
    to distance 0 rather than left negative.
    """
    if q_len > k_len:
        raise ValueError(f"q_len ({q_len}) must not exceed k_len ({k_len})")
    query_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    key_pos = torch.arange(k_len, device=device)[None, :]
    return (query_pos - key_pos).clamp_(min=0)


def diagonal_sums(grad: torch.Tensor) -> torch.Tensor:
    """Sums of ``grad [..., q, k]`` along its diagonals: ``out[..., c] = sum of grad[..., i, j]`` over
    ``i - j + k - 1 = c``, shape ``[..., q + k - 1]`` (``c = k - 1`` is the main diagonal).

    No scatter: the rows are copied into a zeroed ``[q, q + k]`` buffer through a strided view whose
    row stride is one less than the buffer's, so row ``i`` lands shifted left by ``i`` and every
    diagonal of ``grad`` becomes a column of the buffer (at ``j - i + q - 1``); a column sum then
    reads all diagonals at once. One write and one read of ``q * (q + k)`` elements, against
    ``index_put_``'s accumulation over ``q * k`` indices.
    """
    *batch, q_len, k_len = grad.shape
    rows = grad.reshape(-1, q_len, k_len)  # [N, q, k]
    width = q_len + k_len
    buffer = grad.new_zeros(rows.shape[0], q_len, width)  # [N, q, q + k]
    shifted = buffer.as_strided(rows.shape, (q_len * width, width - 1, 1), q_len - 1)  # a fresh buffer: offset 0
    shifted.copy_(rows)
    columns = buffer.sum(-2)[:, : q_len + k_len - 1]  # [N, q + k - 1], column j - i + q - 1
    return columns.flip(-1).reshape(*batch, q_len + k_len - 1)


class _DiagonalGather(torch.autograd.Function):
    """``out[..., i, j] = values[..., i - j + k_len - 1]``: a Toeplitz matrix from its diagonals."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:  # type: ignore[override]
        # window m of the reversed values holds reversed[m + j] = values[q + k - 2 - m - j]; row i is window q - 1 - i
        windows = values.flip(-1).unfold(-1, k_len, 1)  # [..., q, k], row m = window m
        return windows.flip(-2).contiguous()  # [..., q, k]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        return diagonal_sums(grad), None, None


def diagonal_gather(values: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """The ``[..., q_len, k_len]`` matrix whose entry ``(i, j)`` is ``values[..., i - j + k_len - 1]``.

    ``values [..., q_len + k_len - 1]`` holds one value per diagonal, from the top-right corner
    (``i - j = 1 - k_len``) to the bottom-left one (``i - j = q_len - 1``). The backward pass sums the
    gradient along each diagonal (:func:`diagonal_sums`) instead of scattering it back through
    ``q_len * k_len`` indices, as autograd of an index gather would.
    """
    if values.shape[-1] != q_len + k_len - 1:
        raise ValueError(f"need q_len + k_len - 1 = {q_len + k_len - 1} diagonal values, got {values.shape[-1]}")
    return _DiagonalGather.apply(values, q_len, k_len)


def gather_by_distance(table: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """Expand a per-head distance table ``[H, k_len]`` into ``[H, q_len, k_len]``.

    Entry ``(i, j)`` is ``table[:, max(d, 0)]`` with ``d = i - j + k_len - q_len`` (as
    :func:`causal_distances`): a Toeplitz matrix, so it is built by :func:`diagonal_gather` with the
    ``q_len - 1`` diagonals above the causal one (negative ``d``) reading distance 0.
    """
    if q_len > k_len:
        raise ValueError(f"q_len ({q_len}) must not exceed k_len ({k_len})")
    above = table[..., :1].expand(*table.shape[:-1], q_len - 1)  # [H, q - 1], distances 1 - q .. -1
    return diagonal_gather(torch.cat([above, table], dim=-1), q_len, k_len)  # [H, q, k]


def global_head_indices(num_heads: int, head_offset: int = 0, total_heads: int | None = None) -> range:
    """Global indices of the ``num_heads`` local heads, validating the tensor-parallel slice.

    ``total_heads`` defaults to ``head_offset + num_heads`` (all heads local when the offset is 0).
    """
    total = head_offset + num_heads if total_heads is None else total_heads
    if num_heads < 1 or head_offset < 0 or head_offset + num_heads > total:
        raise ValueError(
            f"invalid head slice: num_heads={num_heads}, head_offset={head_offset}, total_heads={total}"
        )
    return range(head_offset, head_offset + num_heads)


@dataclass(frozen=True)
class ModelShape:
    """The model dimensions a positional embedding is built for: one object every family's constructor takes.

    ``num_heads`` are the heads this module serves: all of them, or a tensor-parallel rank's slice,
    which starts at global head ``head_offset`` of ``total_heads`` (default: all heads are local;
    :func:`global_head_indices`). ``num_layers`` is the model's layer count, read by the families with
    per-layer parameters (``cable``).
    """

    num_heads: int
    head_dim: int
    hidden_size: int
    max_positions: int
    num_layers: int = 1
    head_offset: int = 0
    total_heads: int | None = None

    @property
    def all_heads(self) -> int:
        """The model's head count, local or not."""
        return self.head_offset + self.num_heads if self.total_heads is None else self.total_heads

    def head_indices(self) -> range:
        """The global indices of the local heads, validating the slice (:func:`global_head_indices`)."""
        return global_head_indices(self.num_heads, self.head_offset, self.total_heads)


class PositionalEmbedding(nn.Module):
    """Base class: every hook is a no-op; subclasses override the ones their family uses.

    Subclasses set the class attributes:

    * ``kind``: a :class:`PositionKind`.
    * ``state_dict_name``: the submodule name under each layer's ``attention`` that holds this
      embedding's tensors in GPT-NeoX checkpoints (``"rpe"`` for KERPLE and T5,
      ``"alibi_embed"``, ``"rotary_emb"``), or ``None`` when the embedding lives at the input
      (``learned``: ``position_embeddings``) or has no tensors.
    * ``learnable``: whether it owns trainable parameters.
    * ``keep_fp32``: whether its floating-point parameters and buffers stay float32 when the model
      is cast (``model.to(torch.bfloat16)``, ``.half()``): see :meth:`_apply`.
    * ``options_class``: the frozen dataclass declaring the family's config options
      (:mod:`kerple.positional.options`), or ``None`` when it has none; the constructor then takes
      ``options``, one instance of it, after the :class:`ModelShape`.
    * ``tensor_parallel``: whether tensor parallelism can split it by heads (every tensor either
      per head or unused by the heads' shared computation); ``False`` refuses
      ``model_parallel_size > 1`` when the config loads.
    * ``num_layers``: ``None``, or for a family with per-layer parameters the layer count it was
      built for (``shape.num_layers``); the model must have as many layers.
    * ``tableless_term``: whether its logit term has no distance tables (FIRE, CABLE: eager and sdpa
      evaluate the closed form on the grid of positions); a kernel that reads only tables
      (``attention_impl: triton``) then cannot serve it, refused when the config loads.

    Every constructor takes ``(shape, options)`` (``shape`` alone without an ``options_class``).
    Tensor parallelism: an embedding may be given only a slice of the heads. Families whose values
    depend on the global head index (ALiBi slopes, Sandwich compression ratios, T5's xavier fan)
    read ``shape.head_offset`` and ``shape.total_heads`` (:meth:`ModelShape.head_indices`): they are
    part of a tensor-parallel rank's shape, not config options.
    """

    kind: PositionKind = PositionKind.NONE
    state_dict_name: str | None = None
    learnable: bool = False
    keep_fp32: bool = True
    options_class: type | None = None
    tensor_parallel: bool = True
    num_layers: int | None = None
    tableless_term: bool = False

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        self.num_heads = shape.num_heads
        self.head_dim = shape.head_dim
        self.hidden_size = shape.hidden_size
        self.max_positions = shape.max_positions

    @classmethod
    def options_problem(cls, options: Any, shape: ModelShape) -> tuple[str, str] | None:
        """``(option, what is wrong)`` for an option value that this model shape cannot take, checked
        when the config loads (``options``: an instance of ``options_class``, what the constructor
        takes); ``None`` when all fit. The default accepts everything."""
        return None

    @classmethod
    def length_problem(cls, options: Any, shape: ModelShape, length: int, dtype: torch.dtype) -> str | None:
        """What keeps positions ``0 .. length - 1`` from being computed in ``dtype`` (the run's compute
        precision), checked before a training run or an evaluation starts (``options`` as for
        :meth:`options_problem`, ``None`` without an ``options_class``); ``None`` when nothing does.
        The default accepts every length."""
        return None

    # --- input hook -------------------------------------------------------------------------
    def embed(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Return token embeddings ``hidden [b, s, h]`` with position information added.

        ``positions`` is an int64 tensor ``[s]`` of absolute positions.
        """
        return hidden

    def init_input_table(self, init: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Re-initialise a trained input table with the model's ``init_method`` ``init`` (GPT-NeoX
        initialises its learned position table as it does the word embeddings); the default has none."""

    # --- query/key hook ---------------------------------------------------------------------
    def rotate(
        self, query: torch.Tensor, key: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (query, key) ``[b, H, s, head_dim]`` with position information applied."""
        return query, key

    # --- logit hooks ------------------------------------------------------------------------
    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Per-head ``(bias_table, scale_table)``, each float32 ``[H, k_len]`` indexed by distance.

        ``bias_table[h, d]`` is added to the scaled logit of head ``h`` at distance ``d``;
        ``scale_table[h, d]`` multiplies it first. Either is ``None`` when the embedding has no
        such term. Gradients flow from both tables to learnable parameters.
        """
        return None, None

    def logit_term(self) -> LogitTerm | None:
        """The closed form of the logit term for fused kernels, or ``None`` when there is none.

        A closed form computes the term of :meth:`distance_tables` per score from small tensors
        (per-head parameters, on this module's device), reading nothing whose size grows with the
        sequence; its functions must equal the tables on every causal score (the contract tests
        compare values and gradients). ``None`` (the default) makes a fused kernel gather the
        distance tables instead.
        """
        return None

    def layer_logit_term(self, layer: int, hidden: torch.Tensor, cache: KVCache | None = None) -> LogitTerm | None:
        """The term of layer ``layer`` for its attention input ``hidden [b, n, h]``, or ``None`` (the default:
        the term does not depend on the layer).

        Called by every layer before it attends, for every kernel; ``cache`` is the forward's KV cache,
        where a term keeps per-token values of earlier steps (:meth:`KVCache.extend_term_values`).
        The returned closed form is evaluated at absolute positions, like :meth:`logit_term`'s.
        """
        return None

    # --- portable description ---------------------------------------------------------------
    def export_terms(self) -> dict[str, dict[str, Any]]:
        """This embedding as data for the self-contained Hugging Face model (docs/interop.md).

        ``{place: {"form": name, <parameter>: value, ...}}``: ``place`` is where a term acts
        (``input``, ``query_key``, ``bias``, ``weight``, ``layer_bias``, as the hooks above), ``form`` one of the
        formulas ``modeling_kerple.py`` holds for that place, and a parameter is a number, a list
        (one value per head) or ``{"tensor": key, "min": lo, "max": hi}``: a tensor of this module's
        ``state_dict()``, clamped in the forward like :func:`~kerple.positional.functional.straight_through_clamp`.
        ``"float64": True`` computes the term in float64 before its float32 cast. ``{}``: no term.
        """
        raise NotImplementedError(f"{type(self).__name__} does not describe itself for the Hugging Face export")

    # --- monitoring -------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Summary statistics of learnable parameters (mean/std/min/max per tensor); empty if none."""
        return parameter_statistics(self.named_parameters())

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        """Apply ``fn`` (device moves, dtype casts) but keep float32 tensors in float32.

        KERPLE parameters are a handful of scalars per head whose small changes matter (the
        reference keeps them in the fp32 master copy, docs/reference-format.md §2); ALiBi slopes, rotary
        ``inv_freq`` and the like lose precision in bf16. So when ``keep_fp32`` is set, a cast of
        the whole model to bf16/fp16 moves this module to the new device but leaves its float32
        tensors float32 *and unrounded* (the cast result is discarded and the original moved
        instead). The transformer casts the returned tables to its compute dtype where needed.
        Parameters keep their identity (only ``.data`` is replaced), so optimizers stay valid.
        """
        if not self.keep_fp32:
            return super()._apply(fn, recurse)

        def move_keeping_fp32(tensor: torch.Tensor) -> torch.Tensor:
            result = fn(tensor)
            if tensor.dtype == torch.float32 and result.is_floating_point() and result.dtype != torch.float32:
                return tensor.to(device=result.device)
            return result

        return super()._apply(move_keeping_fp32, recurse)

    def _device(self) -> torch.device | None:
        for tensor in list(self.parameters()) + list(self.buffers()):
            return tensor.device
        return None
