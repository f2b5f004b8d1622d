"""Per-head Jacobian tables of a distance-based logit term: what a fused kernel needs to return the
positional parameters' gradient without differentiating the term per score.

A term that depends on the distance alone is the pair of tables ``bias[h, d]`` and ``scale[h, d]``
of :meth:`~kerple.positional.base.PositionalEmbedding.distance_tables`, applied as
``x · scale + bias`` with ``x = q·k/√d`` (KERPLE paper Eq. (2)-(4), §5.3 for the weight). The
parameters of head ``h`` reach only row ``h`` of the tables, so the gradient of a loss through the
attention scores ``S`` is, for the ``k``-th parameter of head ``h`` (``θ[k, h]``),

    dθ[k, h] = Σ_{b, i, j} dS[b, h, i, j] · (∂bias[h, d]/∂θ[k, h] + x[b, h, i, j] · ∂scale[h, d]/∂θ[k, h])

with ``d = i - j``.

:func:`distance_jacobian` builds ``∂bias/∂θ`` and ``∂scale/∂θ`` as ``[P, H, L]`` tables by forward-mode
autograd of the embedding's own ``distance_tables`` (one batched evaluation, ``torch.func.vmap`` over the
``P`` parameter slots, each slot's tangent set for every head at once), so every family with distance
tables gets its gradient this way without new code: KERPLE's and the Gaussian-like kernels' ``[H, 1, 1]``
parameters (through their straight-through clamps), T5's ``[buckets, H]`` table. An embedding opts in by
naming its per-head parameters and their head axis (:meth:`PositionalEmbedding.head_parameters`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, jvp, vmap

from kerple.positional.base import PositionalEmbedding


@dataclass(frozen=True)
class JacobianTables:
    """A distance-based term at distances ``0..L-1`` and its derivatives, all detached: what a kernel reads.

    ``bias``/``scale`` ``[H, L]`` are the tables' values, ``bias_jacobian``/``scale_jacobian`` ``[P, H, L]``
    their derivatives in the ``P`` parameter slots of each head (float32, contiguous); each is ``None``
    where the embedding has no such term. ``support [P, 2]`` int32 holds, per slot, the first and last
    distance at which any head's derivative is non-zero (``[L, -1]`` for none), so a kernel can skip a
    slot in a tile that lies outside it (a T5 bucket reaches a few distances only).
    """

    bias: torch.Tensor | None
    scale: torch.Tensor | None
    bias_jacobian: torch.Tensor | None
    scale_jacobian: torch.Tensor | None
    support: torch.Tensor

    @property
    def num_parameters(self) -> int:
        """``P``: parameter slots per head."""
        return self.support.shape[0]


@dataclass(frozen=True)
class DistanceJacobian:
    """The Jacobian tables of one forward and ``theta [P, H]``, the autograd input their gradient is returned
    to: every per-head parameter rearranged so that ``theta[:, h]`` are head ``h``'s ``P`` values (a
    differentiable view of the parameters, so autograd carries ``dθ`` on to them)."""

    theta: torch.Tensor
    tables: JacobianTables


class _Tables(nn.Module):
    """``embedding.distance_tables`` as a module's forward, for ``torch.func.functional_call``."""

    def __init__(self, embedding: PositionalEmbedding) -> None:
        super().__init__()
        self.embedding = embedding

    def forward(self, length: int, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.embedding.distance_tables(length, device=device)


def _slots(embedding: PositionalEmbedding) -> list[tuple[str, int, torch.Size]]:
    """``(name, head axis, shape)`` of every per-head parameter that needs a gradient, in declaration order."""
    slots = []
    for name, axis in embedding.head_parameters().items():
        parameter = getattr(embedding, name)
        if parameter.requires_grad:
            if parameter.shape[axis] != embedding.num_heads:
                raise ValueError(f"{type(embedding).__name__}.{name} {tuple(parameter.shape)}: axis {axis} is not the "
                                 f"{embedding.num_heads} heads")
            slots.append((name, axis, parameter.shape))
    return slots


def stacked_parameters(embedding: PositionalEmbedding) -> torch.Tensor | None:
    """``theta [P, H]`` float32: the per-head parameters, head axis last, flattened and concatenated
    (differentiable); ``None`` when the embedding declares none that need a gradient."""
    slots = _slots(embedding)
    if not slots:
        return None
    heads = embedding.num_heads
    pieces = [getattr(embedding, name).float().movedim(axis, -1).reshape(-1, heads) for name, axis, _ in slots]
    return torch.cat(pieces, dim=0)


def _unstacked(theta: torch.Tensor, slots: list[tuple[str, int, torch.Size]]) -> dict[str, torch.Tensor]:
    """The parameters of ``theta [P, H]`` in their own shapes (the inverse of :func:`stacked_parameters`)."""
    parameters, first = {}, 0
    for name, axis, shape in slots:
        moved = torch.Size([*shape[:axis], *shape[axis + 1:], shape[axis]])
        count = moved.numel() // shape[axis]
        parameters[name] = theta[first : first + count].reshape(moved).movedim(-1, axis)
        first += count
    return parameters


def distance_jacobian(
    embedding: PositionalEmbedding, length: int, device: torch.device, temperature: float = 1.0
) -> DistanceJacobian | None:
    """The tables of ``embedding`` at distances ``0..length-1`` and their per-head Jacobians (module
    docstring); ``None`` when it declares no per-head parameter that needs a gradient.

    ``temperature`` τ divides the bias as the model does (thesis §5.4), and so its derivative.
    """
    slots = _slots(embedding)
    theta = stacked_parameters(embedding)
    if theta is None:
        return None
    embedding.distance_tables(length, device=device)  # fill the families' distance caches outside the transforms
    present: list[bool] = []  # whether each of (bias, scale) exists, recorded by the (one, batched) evaluation

    def tables(stacked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        parameters = {f"embedding.{name}": value for name, value in _unstacked(stacked, slots).items()}
        bias, scale = functional_call(_Tables(embedding), parameters, (length, device))
        present[:] = [bias is not None, scale is not None]
        zeros = stacked.new_zeros(embedding.num_heads, length)  # an absent term (jvp needs tensors; dropped below)
        return (zeros if bias is None else bias.float() / temperature), (zeros if scale is None else scale.float())

    def directional(tangent: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return jvp(tables, (primal,), (tangent,))

    primal = theta.detach()
    count = theta.shape[0]
    tangents = torch.eye(count, device=primal.device)[:, :, None].expand(count, count, embedding.num_heads)  # [P, P, H]
    (bias, scale), (bias_jacobian, scale_jacobian) = vmap(directional, out_dims=((None, None), (0, 0)))(tangents)
    has_bias, has_scale = present
    present_jacobians = [j for j, there in ((bias_jacobian, has_bias), (scale_jacobian, has_scale)) if there]
    support = _support(present_jacobians, length)
    tables = JacobianTables(
        bias=bias.contiguous() if has_bias else None,
        scale=scale.contiguous() if has_scale else None,
        bias_jacobian=bias_jacobian.contiguous() if has_bias else None,
        scale_jacobian=scale_jacobian.contiguous() if has_scale else None,
        support=support,
    )
    return DistanceJacobian(theta, tables)


def _support(jacobians: list[torch.Tensor], length: int) -> torch.Tensor:
    """``[P, 2]`` int32: first and last distance with a non-zero derivative in any head (``[L, -1]`` if none)."""
    nonzero = torch.stack([j != 0 for j in jacobians]).any(0).any(1)  # [P, L]
    positions = torch.arange(length, device=nonzero.device)
    first = torch.where(nonzero, positions, length).amin(-1)
    last = torch.where(nonzero, positions, -1).amax(-1)
    return torch.stack([first, last], dim=-1).to(torch.int32)
