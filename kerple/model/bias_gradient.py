"""The gradient of a distance-based logit term's tables, computed apart from the attention kernel.

FlexAttention's backward returns the gradient of a tensor its ``score_mod`` captured with one atomic
add per score at the index the score read: for a per-head KERPLE parameter, ``B·L²/2`` atomics on one
address per head (docs/gpu-report.md: a 162M ``kerple_log`` step took 1,431 ms through it, 98 ms through
sdpa with a materialised bias). So the fused kernel gets the term **detached** (its forward and
``dq``/``dk``/``dv`` are unchanged, and a captured tensor that needs no gradient costs no atomics), and
the gradient of the term's distance tables ``bias[h, d]``, ``scale[h, d]`` (applied as ``x · scale + bias``,
``x = q·k/√d``, KERPLE paper Eq. (2)-(4), §5.3 for the weight) comes from a separate reduction over the
same tiles (FlashAttention-2's backward, Dao 2023, Algorithm 2, without the ``dq``/``dk``/``dv`` products)::

    P = exp(S - lse)      dP = dO Vᵀ      dS = P ∘ (dP - rowsum(dO ∘ O))
    dbias[h, d] = Σ_{b, i - j = d} dS          dscale[h, d] = Σ_{b, i - j = d} dS ∘ x

the sums of ``dS`` along each diagonal of the score matrix. Ordinary autograd then carries the tables'
gradient through the embedding's own table function to its parameters (and through the temperature
division the model applies): no per-family code, and no per-parameter work in the reduction.

* **CUDA**: the Triton kernel of :mod:`kerple.model.bias_gradient_triton` (per-band partial vectors,
  summed in a fixed order: deterministic).
* **CPU**: the same reduction in torch, one block of query rows at a time: ``dS`` summed over the
  batch and along each diagonal of the block (:func:`~kerple.positional.base.diagonal_sums`).

It joins autograd as an identity on the attention output whose backward also returns the tables'
gradient (:func:`with_table_gradient`): a ``torch.library`` custom op, so a compiled layer traces it as
one opaque call (forward: a copy of the output; backward: this reduction).
"""

from __future__ import annotations

import logging

import torch

from kerple.model.sdpa_cpu import key_range
from kerple.positional.base import diagonal_sums

logger = logging.getLogger(__name__)
# Why the Triton kernel could not run on this machine, once it failed (it then stays off for the process).
_TRITON_FAILURE: list[str] = []

QUERY_BLOCK = 64  # query rows per block of the CPU reduction (as sdpa_cpu's backward)


def row_terms(output: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """``rowsum(dO ∘ O)`` float32 ``[b, H, L]``."""
    return (grad_output.float() * output.float()).sum(-1)


def _distance_sums(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
    grad_output: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``Σ dS`` and ``Σ dS ∘ x`` per (head, distance), float32 ``[H, L]`` (``None`` without a bias, a scale
    table), one block of :data:`QUERY_BLOCK` query rows at a time over the keys it can see."""
    batch, heads, length, dim = query.shape
    flat = (batch * heads, length, dim)
    scaled_query = (query.float() * dim**-0.5).reshape(flat)
    key, value, grad_output = key.float().reshape(flat), value.float().reshape(flat), grad_output.float().reshape(flat)
    positions = torch.arange(length, device=query.device)
    bias_sums, scale_sums = (None if table is None else query.new_zeros(heads, length, dtype=torch.float32)
                             for table in (bias, scale))
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
        if bias_sums is not None:
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


def table_gradients(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, lse: torch.Tensor,
    grad_output: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dbias, dscale)`` float32 ``[H, L]`` (``None`` for an absent table) of attention
    ``output = softmax(x · scale + bias) V`` (causal, ``window``), for ``query``/``key``/``value``/``output``/
    ``grad_output`` ``[b, H, L, d]``, its ``lse [b, H, L]`` (natural log) and the tables ``[H, L]``: Triton on
    CUDA, torch on a CPU (module docstring)."""
    delta = row_terms(output, grad_output)
    lse = lse.float().contiguous()
    bias, scale = (None if t is None else t.detach().float().contiguous() for t in (bias, scale))
    return _reduce(query, key, value, lse, delta, grad_output, bias, scale, window, query.device.type == "cuda")


def _reduce(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
    grad_output: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
    triton: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The Triton kernel where ``triton`` asks for it and it has not failed here before, else the torch
    reduction (the same sums, on any device). A kernel that does not compile or launch on this GPU
    (a Triton or driver version it was not built for) costs a warning and speed, not the run."""
    if triton and not _TRITON_FAILURE:
        try:
            return _triton_sums(query, key, value, grad_output, lse, delta, bias, scale, window)
        except Exception as error:  # noqa: BLE001 -- any failure of the kernel: the torch path gives the same sums
            first_line = (str(error).strip().splitlines() or [""])[0][:300]
            _TRITON_FAILURE.append(f"{type(error).__name__}: {first_line}")
            logger.warning("the Triton bias-gradient kernel failed (%s); the positional parameters' gradient "
                           "comes from the torch reduction from now on (same values, slower)", _TRITON_FAILURE[0])
    return _distance_sums(query, key, value, lse, delta, grad_output, bias, scale, window)


def _triton_sums(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, grad_output: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The Triton kernel's partials summed over chunks, batch and overlapping bands, in a fixed order."""
    from kerple.model.bias_gradient_triton import diagonal_partials, distance_sums_from_partials

    heads, length = query.shape[1:3]
    query, key, value, grad_output = (t if t.stride(-1) == 1 else t.contiguous()
                                      for t in (query, key, value, grad_output))
    partials = diagonal_partials(query, key, value, grad_output, lse, delta, bias, scale, window)
    return tuple(None if p is None else distance_sums_from_partials(p, heads, length)  # type: ignore[return-value]
                 for p in partials)


@torch.library.custom_op("kerple::distance_table_gradient", mutates_args=())
def _gradient_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, lse: torch.Tensor,
    grad_output: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    """The present tables' gradients stacked, ``[T, H, L]`` (``bias`` first)."""
    gradients = table_gradients(query, key, value, output, lse, grad_output, bias, scale, window)
    return torch.stack([g for g in gradients if g is not None])


@_gradient_op.register_fake
def _(query, key, value, output, lse, grad_output, bias, scale, window):  # type: ignore[no-untyped-def]
    present = [t for t in (bias, scale) if t is not None]
    return query.new_empty(len(present), *present[0].shape, dtype=torch.float32)


@torch.library.custom_op("kerple::with_distance_table_gradient", mutates_args=())
def _identity_op(
    output: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lse: torch.Tensor,
    bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    return output.clone()  # a custom op's output may not alias its input


@_identity_op.register_fake
def _(output, *rest):  # type: ignore[no-untyped-def]
    return torch.empty_like(output)


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    attention_output, query, key, value, lse, bias, scale, window = inputs
    ctx.save_for_backward(query, key, value, attention_output, lse, bias, scale)
    ctx.window = window


def _backward(ctx, grad_output):  # type: ignore[no-untyped-def]
    query, key, value, output, lse, bias, scale = ctx.saved_tensors
    stacked = torch.ops.kerple.distance_table_gradient(query, key, value, output, lse, grad_output, bias, scale,
                                                       ctx.window)
    gradients = iter(stacked.unbind(0))
    grad_bias, grad_scale = (None if t is None else next(gradients).to(t.dtype) for t in (bias, scale))
    return grad_output, None, None, None, None, grad_bias, grad_scale, None


_identity_op.register_autograd(_backward, setup_context=_setup_context)


def with_table_gradient(
    output: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lse: torch.Tensor,
    bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
) -> torch.Tensor:
    """``output`` unchanged, with a backward that also gives the distance tables ``bias``/``scale`` ``[H, L]``
    (either may be ``None``, not both) their gradient through the attention ``output [b, H, L, d]`` of
    ``query``/``key``/``value`` (``lse [b, H, L]``, the kernel's)."""
    if bias is None and scale is None:
        raise ValueError("with_table_gradient needs a bias or a scale table")
    return torch.ops.kerple.with_distance_table_gradient(output, query, key, value, lse.detach(), bias, scale, window)
