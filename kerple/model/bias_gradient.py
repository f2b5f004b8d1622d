"""The positional parameters' gradient of a distance-based logit term, computed apart from the
attention kernel and summed tile by tile.

FlexAttention's backward returns the gradient of a tensor its ``score_mod`` captured with one atomic
add per score at the index the score read: for a per-head KERPLE parameter, ``B·L²/2`` atomics on one
address per head (docs/gpu-report.md: a 162M ``kerple_log`` step took 1,431 ms through it, 98 ms through
sdpa with a materialised bias). So the fused kernel gets the term **detached** (its forward and
``dq``/``dk``/``dv`` are unchanged, and a captured tensor that needs no gradient costs no atomics), and
the parameters' gradient comes from a separate reduction over the same tiles (FlashAttention-2's
backward, Dao 2023, Algorithm 2, without the ``dq``/``dk``/``dv`` products)::

    P = exp(S - lse)      dP = dO Vᵀ      dS = P ∘ (dP - rowsum(dO ∘ O))
    dθ[k, h] = Σ dS ∘ (∂bias/∂θ_k + x · ∂scale/∂θ_k)[h, i - j]          (x = q·k/√d)

with the per-head Jacobian tables of :mod:`kerple.positional.jacobian`. Each tile's sum is one partial,
written without atomics and summed in a fixed order (deterministic).

* **CUDA**: the Triton kernel of :mod:`kerple.model.bias_gradient_triton`, one program per tile.
* **CPU**: the same reduction in torch, one block of query rows at a time: ``dS`` summed over the
  batch and along each diagonal of the block (:func:`~kerple.positional.base.diagonal_sums`), then
  contracted with the Jacobian over distances (the same sum, ordered by distance: on a CPU one pass
  over ``dS`` instead of one per parameter).

It joins autograd as an identity on the attention output whose backward also returns ``dθ``
(:func:`with_parameter_gradient`): a ``torch.library`` custom op, so a compiled layer traces it as one
opaque call (forward: a copy of the output; backward: this reduction).
"""

from __future__ import annotations

import torch

from kerple.model.sdpa_cpu import key_range
from kerple.positional.base import diagonal_sums
from kerple.positional.jacobian import DistanceJacobian, JacobianTables

QUERY_BLOCK = 64  # query rows per block of the CPU reduction (as sdpa_cpu's backward)


def row_terms(output: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """``rowsum(dO ∘ O)`` float32 ``[b, H, L]``."""
    return (grad_output.float() * output.float()).sum(-1)


def _distance_sums(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
    grad_output: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``Σ dS`` and ``Σ dS ∘ x`` per (head, distance), float32 ``[H, L]`` (the second ``None`` without a
    scale), one block of :data:`QUERY_BLOCK` query rows at a time over the keys it can see."""
    batch, heads, length, dim = query.shape
    flat = (batch * heads, length, dim)
    scaled_query = (query.float() * dim**-0.5).reshape(flat)
    key, value, grad_output = key.float().reshape(flat), value.float().reshape(flat), grad_output.float().reshape(flat)
    positions = torch.arange(length, device=query.device)
    bias_sums = query.new_zeros(heads, length, dtype=torch.float32)
    scale_sums = None if scale is None else torch.zeros_like(bias_sums)
    for first in range(0, length, QUERY_BLOCK):
        last = min(first + QUERY_BLOCK, length)
        start, end = key_range(first, last, length, 0, window)
        rows, keys = slice(first, last), slice(start, end)
        block = (batch, heads, last - first, end - start)
        distance = positions[rows, None] - positions[None, keys]  # [m, n]
        visible = distance >= 0 if window is None else (distance >= 0) & (distance < window)
        index = distance.clamp(0, length - 1)
        logits = torch.bmm(scaled_query[:, rows], key[:, keys].transpose(1, 2)).view(block)  # x [b, H, m, n]
        scores = logits if scale is None else logits * scale[:, index]
        if bias is not None:
            scores = scores + bias[:, index]
        probs = (scores - lse[:, :, rows, None]).exp_().masked_fill_(~visible, 0.0)
        grad_scores = torch.bmm(grad_output[:, rows], value[:, keys].transpose(1, 2)).view(block)
        grad_scores = grad_scores.sub_(delta[:, :, rows, None]).mul_(probs)  # dS [b, H, m, n]
        _add_diagonals(bias_sums, grad_scores.sum(0), first - start, length)
        if scale_sums is not None:
            _add_diagonals(scale_sums, (grad_scores * logits).sum(0), first - start, length)
    return bias_sums, scale_sums


def _add_diagonals(sums: torch.Tensor, block: torch.Tensor, offset: int, length: int) -> None:
    """Add the diagonal sums of ``block [H, m, n]`` (rows ``offset`` after its first key) to ``sums [H, L]``
    by distance; distances outside ``[0, L)`` are dropped (their scores are masked)."""
    rows, cols = block.shape[-2:]
    diagonals = diagonal_sums(block)  # [H, m + n - 1], entry c at distance offset - (n - 1) + c
    base = offset - (cols - 1)
    low = max(0, -base)
    high = min(rows + cols - 1, length - base)
    sums[:, base + low : base + high] += diagonals[:, low:high]


def parameter_gradient(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, lse: torch.Tensor,
    grad_output: torch.Tensor, tables: JacobianTables, window: int | None,
) -> torch.Tensor:
    """``dθ [P, H]`` float32 of attention ``output = softmax(x · scale + bias) V`` (causal, ``window``), for
    ``query``/``key``/``value``/``output``/``grad_output`` ``[b, H, L, d]`` and its ``lse [b, H, L]``
    (natural log, float32): Triton on CUDA, torch on a CPU (module docstring)."""
    delta = row_terms(output, grad_output)
    lse = lse.float().contiguous()
    if query.device.type == "cuda":
        return _triton_gradient(query, key, value, grad_output, lse, delta, tables, window)
    bias_sums, scale_sums = _distance_sums(query, key, value, lse, delta, grad_output, tables.bias, tables.scale,
                                           window)
    gradient = query.new_zeros(tables.num_parameters, query.shape[1], dtype=torch.float32)
    if tables.bias_jacobian is not None:
        gradient += torch.einsum("phl,hl->ph", tables.bias_jacobian, bias_sums)
    if tables.scale_jacobian is not None:
        gradient += torch.einsum("phl,hl->ph", tables.scale_jacobian, scale_sums)
    return gradient


def _triton_gradient(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, grad_output: torch.Tensor,
                     lse: torch.Tensor, delta: torch.Tensor, tables: JacobianTables,
                     window: int | None) -> torch.Tensor:
    """The Triton kernel's partials summed over tiles and batch, in a fixed order: ``[P, H]``."""
    from kerple.model.bias_gradient_triton import tile_partials

    batch, heads = query.shape[:2]
    query, key, value, grad_output = (t if t.stride(-1) == 1 else t.contiguous()
                                      for t in (query, key, value, grad_output))
    partials = tile_partials(query, key, value, grad_output, lse, delta, tables.bias, tables.scale,
                             tables.bias_jacobian, tables.scale_jacobian, tables.support, window)
    return partials.sum((0, 1)).view(batch, heads, -1).sum(0).transpose(0, 1)  # [P, H]


@torch.library.custom_op("kerple::distance_term_gradient", mutates_args=())
def _gradient_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, lse: torch.Tensor,
    grad_output: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None,
    bias_jacobian: torch.Tensor | None, scale_jacobian: torch.Tensor | None, support: torch.Tensor,
    window: int | None,
) -> torch.Tensor:
    tables = JacobianTables(bias, scale, bias_jacobian, scale_jacobian, support)
    return parameter_gradient(query, key, value, output, lse, grad_output, tables, window)


@_gradient_op.register_fake
def _(query, key, value, output, lse, grad_output, *tables_and_window):  # type: ignore[no-untyped-def]
    support = tables_and_window[4]
    return query.new_empty(support.shape[0], query.shape[1], dtype=torch.float32)


@torch.library.custom_op("kerple::with_distance_term_gradient", mutates_args=())
def _identity_op(
    output: torch.Tensor, theta: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    lse: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, bias_jacobian: torch.Tensor | None,
    scale_jacobian: torch.Tensor | None, support: torch.Tensor, window: int | None,
) -> torch.Tensor:
    return output.clone()  # a custom op's output may not alias its input


@_identity_op.register_fake
def _(output, *rest):  # type: ignore[no-untyped-def]
    return torch.empty_like(output)


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    attention_output, theta, query, key, value, lse, *tables, window = inputs  # tables: bias .. support
    ctx.save_for_backward(query, key, value, attention_output, lse, *tables)
    ctx.window = window
    ctx.theta_dtype = theta.dtype


def _backward(ctx, grad_output):  # type: ignore[no-untyped-def]
    query, key, value, output, lse, bias, scale, bias_jacobian, scale_jacobian, support = ctx.saved_tensors
    grad_theta = torch.ops.kerple.distance_term_gradient(query, key, value, output, lse, grad_output, bias, scale,
                                                         bias_jacobian, scale_jacobian, support, ctx.window)
    return (grad_output, grad_theta.to(ctx.theta_dtype), *([None] * 10))


_identity_op.register_autograd(_backward, setup_context=_setup_context)


def with_parameter_gradient(
    output: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lse: torch.Tensor,
    jacobian: DistanceJacobian, window: int | None,
) -> torch.Tensor:
    """``output`` unchanged, with a backward that also gives ``jacobian.theta`` its gradient through the
    attention ``output [b, H, L, d]`` of ``query``/``key``/``value`` (``lse [b, H, L]``, the kernel's)."""
    tables = jacobian.tables
    return torch.ops.kerple.with_distance_term_gradient(
        output, jacobian.theta, query, key, value, lse.detach(), tables.bias, tables.scale, tables.bias_jacobian,
        tables.scale_jacobian, tables.support, window,
    )
