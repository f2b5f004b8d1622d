"""A logit term as fused attention kernels take it: a function evaluated per score, in the kernel.

FlexAttention applies a ``score_mod(score, b, h, q_idx, kv_idx)`` to every score inside its fused
kernel. An embedding's term reaches it as a :class:`LogitTerm`: small captured tensors plus pure
functions of those tensors and of the score's :class:`ScorePosition` (batch, head, query position,
key position). Two forms exist:

* **closed form** (:meth:`PositionalEmbedding.logit_term`): the term is computed from per-head
  tensors (KERPLE's ``[H]`` parameters, ALiBi's slopes), e.g. ``-r1[h]·log(1 + r2[h]·d)``
  (KERPLE paper §4). Nothing of size ``L`` is read, so no tile of gathered values occupies the
  kernel's shared memory. In training the kernel gets the term detached (:meth:`LogitTerm.detached`)
  and the gradient of its distance tables comes from a separate reduction
  (:mod:`kerple.model.bias_gradient`), autograd carrying it on to the parameters;
  a term whose tensors keep their gradient (FIRE, CABLE) has it returned by FlexAttention's own
  backward (CUDA), which scatters it into the captured tensors.
* **distance table** (:func:`distance_table_term`): for terms without a closed form (T5 buckets,
  Sandwich's cosine sums) the kernel gathers ``table[h, d]`` from the ``[H, L]`` distance tables,
  cast to the compute dtype (a bf16 table tile takes half the shared memory of an fp32 one).

The functions receive absolute positions, not only the distance, and the batch index, so terms
that depend on more than ``i - j`` fit the same structure: a term of the query position (FIRE:
``MLP(ψ(i - j) / ψ(max(i, L)))``, its MLP weights captured) or of per-token tensors ``[b, H, L]``
indexed by ``(b, h, i)`` or ``(b, h, j)`` (CABLE). FlexAttention's own rule applies to every
captured tensor that needs a gradient: index it once per function call (it scatters that one
index's gradient); a tensor read at two indices is captured twice (two clones).

Every captured tensor passes through :func:`kernel_tensor` (:class:`LogitTerm` applies it to its
``tensors``): under AOTAutograd, which compiles FlexAttention on CUDA, a captured tensor that is a
*view* of a tensor needing a gradient (``param.reshape(H)``) silently gets no gradient: the
positional parameters of every KERPLE variant stayed at their initial values on a GPU until this
rule. A fresh copy of its own storage is differentiated like any other buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

import torch


class ScorePosition(NamedTuple):
    """Where one attention score sits: integer tensors that broadcast against each other.

    Inside FlexAttention each is a scalar index; evaluated on a grid (tests, eager fallbacks) they
    are broadcastable index tensors, e.g. ``head [H, 1, 1]``, ``query [1, q, 1]``, ``key [1, 1, k]``.
    """

    batch: torch.Tensor
    head: torch.Tensor
    query: torch.Tensor  # absolute position i of the query
    key: torch.Tensor  # absolute position j of the key


TermFunction = Callable[[tuple[torch.Tensor, ...], ScorePosition], torch.Tensor]


def kernel_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` made safe to capture in a compiled FlexAttention kernel: a contiguous copy with its
    own storage when it needs a gradient and is a view or a leaf (a parameter), else ``tensor``.

    AOTAutograd drops the gradient of a captured view of a differentiated tensor without an error
    (the project's torch, docs/development.md; see the module docstring), so nothing that needs a gradient may reach a kernel as
    one. The copy is differentiable (autograd carries its gradient to the parameter) and costs one
    small copy per forward: captured tensors are per-head or per-token vectors, never ``L x L``.
    Idempotent: a copy is neither a view nor a leaf.
    """
    if tensor.requires_grad and (tensor.is_leaf or tensor._base is not None):  # _base: a view, and traceable
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def unsafe_captures(tensors: tuple[torch.Tensor, ...]) -> list[int]:
    """Indices of ``tensors`` that :func:`kernel_tensor` would copy (kernels refuse such captures)."""
    return [index for index, tensor in enumerate(tensors) if kernel_tensor(tensor) is not tensor]


def causal_distance(position: ScorePosition) -> torch.Tensor:
    """Float32 ``d = i - j``, clamped at 0.

    Scores with ``j > i`` are masked by the kernel after the term is added; clamping keeps the term
    (and, in the backward pass, its derivative) finite there, so no NaN can reach a gradient
    through a masked score (``log(1 + r·d)`` with ``r·d < -1`` would be NaN).
    """
    return torch.clamp(position.query - position.key, min=0).to(torch.float32)


@dataclass(frozen=True)
class LogitTerm:
    """``score * scale(tensors, position) + bias(tensors, position)`` for each score of a fused kernel.

    ``tensors`` are everything the functions read (captured by the kernel; each stored as
    :func:`kernel_tensor` makes it, so a view of a parameter cannot lose its gradient); ``bias`` / ``scale``
    may be ``None`` (no such term). ``kind`` names the form for kernel-option choice and reports;
    ``gathered_bytes`` is the size, per score, of the values gathered from memory in a tile shaped
    like the score tile (0 for a closed form; the table's element size for a distance table):
    FlexAttention stages such a tile in shared memory (:mod:`kerple.model.flex_options`).
    """

    tensors: tuple[torch.Tensor, ...]
    bias: TermFunction | None = None
    scale: TermFunction | None = None
    kind: str = "closed_form"
    gathered_bytes: int = 0

    def __post_init__(self) -> None:
        """Every captured tensor through :func:`kernel_tensor`, whoever built the term."""
        object.__setattr__(self, "tensors", tuple(kernel_tensor(tensor) for tensor in self.tensors))

    def apply(self, score: torch.Tensor, position: ScorePosition) -> torch.Tensor:
        """The scaled logit with this term applied (the scale first, then the bias: reference order)."""
        if self.scale is not None:
            score = score * self.scale(self.tensors, position)
        if self.bias is not None:
            score = score + self.bias(self.tensors, position)
        return score

    def detached(self) -> LogitTerm:
        """The same term with every captured tensor detached: a fused kernel then returns no gradient for
        them (a kernel whose term's gradient comes apart, :mod:`kerple.model.bias_gradient`)."""
        return replace(self, tensors=tuple(tensor.detach() for tensor in self.tensors))

    def divide_bias(self, temperature: float) -> LogitTerm:
        """The same term with its bias divided by a softmax temperature τ (thesis §5.4).

        ``1/τ`` is a captured 0-d tensor rather than a constant in the function, so another τ reuses
        the compiled kernel instead of compiling a new one.
        """
        if temperature == 1.0 or self.bias is None:
            return self
        inner, slot = self.bias, len(self.tensors)
        reference = self.tensors[0]
        inverse = torch.tensor(1.0 / temperature, dtype=torch.float32, device=reference.device)

        def bias(tensors: tuple[torch.Tensor, ...], position: ScorePosition) -> torch.Tensor:
            return inner(tensors, position) * tensors[slot]

        return replace(self, tensors=(*self.tensors, inverse), bias=bias)


def per_head_term(
    formula: Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor],
    names: tuple[str, ...],
    first: int = 0,
) -> TermFunction:
    """A term function evaluating ``formula(params, distance)`` with ``params[name] = tensor[h]``,
    the ``[H]`` tensors ``tensors[first:first + len(names)]`` in the order of ``names``.

    ``formula`` is the same broadcasting expression a family uses for its distance tables (there
    with ``[H, 1]`` parameters and ``[1, L]`` distances), so the closed form and the table are one
    formula. Each captured tensor is indexed once, as FlexAttention requires.
    """

    def term(tensors: tuple[torch.Tensor, ...], position: ScorePosition) -> torch.Tensor:
        params = {name: tensors[first + slot][position.head] for slot, name in enumerate(names)}
        return formula(params, causal_distance(position))

    return term


def distance_table_term(
    bias_table: torch.Tensor | None, scale_table: torch.Tensor | None, dtype: torch.dtype
) -> LogitTerm | None:
    """The term that gathers ``table[h, d]`` from ``[H, L]`` distance tables cast to ``dtype``.

    Distances are clamped into ``[0, L - 1]`` (clamped scores are masked). ``None`` when both
    tables are ``None``.
    """
    tables = tuple(table.to(dtype) for table in (bias_table, scale_table) if table is not None)
    if not tables:
        return None
    last = tables[0].shape[-1] - 1
    scale_slot = len(tables) - 1 if scale_table is not None else None

    def index(position: ScorePosition) -> torch.Tensor:
        return torch.clamp(position.query - position.key, 0, last)

    def bias(tensors: tuple[torch.Tensor, ...], position: ScorePosition) -> torch.Tensor:
        return tensors[0][position.head, index(position)]

    def scale(tensors: tuple[torch.Tensor, ...], position: ScorePosition) -> torch.Tensor:
        return tensors[scale_slot][position.head, index(position)]

    return LogitTerm(
        tensors=tables,
        bias=bias if bias_table is not None else None,
        scale=scale if scale_slot is not None else None,
        kind="distance_table",
        gathered_bytes=sum(table.element_size() for table in tables),
    )
