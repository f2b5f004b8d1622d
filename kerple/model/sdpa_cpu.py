"""Attention with an additive float mask on CPU: PyTorch's fused flash kernel forward, and a backward
that also returns the mask's gradient.

``scaled_dot_product_attention`` on CPU runs a fused flash kernel for a float mask, but that kernel
has no gradient for the mask; when the mask requires one (a learnable KERPLE or T5 bias), PyTorch
falls back to its unfused math path, which keeps the ``[b, H, q, k]`` probabilities for the
backward pass, computes all of the ``q x k`` scores although the causal half is masked, and adds
safe-softmax passes. Here the forward is the flash kernel itself (``is_causal`` when queries and keys
coincide, so fully masked tiles are skipped) and the backward is the standard attention backward
(Dao 2023, *FlashAttention-2*, Algorithm 2), recomputing the probabilities from the saved
log-sum-exp one block of query rows at a time, over the keys that block can see:

    P = exp(q kᵀ · scale + mask - lse)      dV = Pᵀ dO        dP = dO vᵀ
    dS = P ∘ (dP - rowsum(dO ∘ O))          dQ = dS k · scale dK = dSᵀ q · scale
    d mask = Σ_batch dS

The mask is a Toeplitz matrix (every entry depends on the distance ``i - j`` alone), so it is passed
with its diagonals, and the gradient goes to the diagonals directly: each block's ``Σ_batch dS`` is
summed along its diagonals (:func:`~kerple.positional.base.diagonal_sums`) without a scatter and
without an ``[H, q, k]`` gradient.

When the mask needs no gradient (ALiBi, a window mask) the backward is the fused flash kernel's own.
"""

from __future__ import annotations

import torch

from kerple.positional.base import diagonal_sums

# The CPU flash kernel and its backward (present since PyTorch 2.2; None where a build lacks them).
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)

# Query rows per block of the backward pass. Smaller blocks skip more of the masked causal half
# (the work is ~ (1 + BLOCK / q_len) / 2 of the full q x k) but issue more, smaller operations.
# benchmarks/bias_attention.py, 1 thread, fwd+bwd vs causal SDPA: 64 rows 1.06x / 1.85x at 512 /
# 2048 tokens, 128 rows 1.20x / 1.89x, 256 rows 1.36x / 2.17x.
BACKWARD_BLOCK = 64


def supported(query: torch.Tensor, dropout_p: float) -> bool:
    """Whether :func:`masked_attention` serves this call: CPU, fp32/fp64, no dropout, kernel present."""
    return (
        _FLASH is not None
        and _FLASH_BACKWARD is not None
        and query.device.type == "cpu"
        and query.dtype in (torch.float32, torch.float64)
        and dropout_p == 0.0
    )


def key_range(first: int, last: int, k_len: int, offset: int, window: int | None) -> tuple[int, int]:
    """Keys ``[start, end)`` visible to any query row in ``[first, last)``.

    Query row ``i`` sees key ``j`` when ``0 <= i + offset - j < window`` (``offset = k_len - q_len``;
    no window: any ``j <= i + offset``); every key outside the returned range is masked for all rows.
    """
    end = min(k_len, last + offset)
    start = 0 if window is None else max(0, first + offset - window + 1)
    return start, end


class _MaskedAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, diagonals: torch.Tensor | None,
        mask: torch.Tensor, window: int | None,
    ) -> torch.Tensor:
        causal = query.shape[-2] == key.shape[-2]
        output, lse = _FLASH(query, key, value, 0.0, causal, attn_mask=mask)  # [b, H, q, d], [b, H, q]
        ctx.save_for_backward(query, key, value, mask, output, lse)
        ctx.window = window
        ctx.diagonals = None if diagonals is None else (diagonals.shape, diagonals.dtype)
        return output

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        query, key, value, mask, output, lse = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        if not ctx.needs_input_grad[3]:
            causal = query.shape[-2] == key.shape[-2]
            grads = _FLASH_BACKWARD(grad_output, query, key, value, output, lse, 0.0, causal, attn_mask=mask)
            return (*grads, None, None, None)
        grad_diagonals = torch.zeros(ctx.diagonals[0], dtype=ctx.diagonals[1], device=query.device)
        grads = _backward_with_mask(query, key, value, mask, output, lse, grad_output, ctx.window, grad_diagonals)
        return (*grads, grad_diagonals, None, None)


def _backward_with_mask(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    output: torch.Tensor,
    lse: torch.Tensor,
    grad_output: torch.Tensor,
    window: int | None,
    grad_diagonals: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of query, key and value (returned) and of the mask's diagonals (added into
    ``grad_diagonals [H or 1, q + k - 1]``), block by block of query rows (module docstring).

    Batch and heads are flattened (``[b·H, len, d]``) so every product is one ``bmm``/``baddbmm``
    (the accumulations into dK and dV, and dQ with its scale, happen inside the GEMM): few, large
    operations, which matters when the intra-op threads compete for cores. Each block's mask
    gradient (summed over the batch) is reduced to its diagonals at once, so no ``[H, q, k]``
    gradient is ever materialized.
    """
    batch, heads, q_len, dim = query.shape
    k_len = key.shape[-2]
    scale = dim**-0.5
    flat = (batch * heads, -1, dim)
    scaled_query = (query * scale).reshape(flat)  # [bH, q, d]
    key, value, grad_output = key.reshape(flat), value.reshape(flat), grad_output.reshape(flat)
    row_term = (grad_output * output.reshape(flat)).sum(-1, keepdim=True).view(batch, heads, q_len, 1)  # rowsum(dO ∘ O)
    grad_query, grad_key, grad_value = torch.empty_like(scaled_query), torch.zeros_like(key), torch.zeros_like(value)
    for first in range(0, q_len, BACKWARD_BLOCK):
        last = min(first + BACKWARD_BLOCK, q_len)
        start, end = key_range(first, last, k_len, k_len - q_len, window)
        rows, keys = slice(first, last), slice(start, end)
        block = (batch, heads, last - first, end - start)
        probs = torch.bmm(scaled_query[:, rows], key[:, keys].transpose(1, 2)).view(block)  # [b, H, m, n]
        probs.add_(mask[:, :, rows, keys]).sub_(lse[:, :, rows, None]).exp_()
        grad_scores = torch.bmm(grad_output[:, rows], value[:, keys].transpose(1, 2)).view(block)  # [b, H, m, n]
        grad_scores.sub_(row_term[:, :, rows]).mul_(probs)
        block_grad = grad_scores.sum(0).sum_to_size(grad_diagonals.shape[0], *block[2:])  # [H or 1, m, n]
        base = first - start + k_len - (end - start)  # diagonal index of the block's top-right corner
        grad_diagonals[:, base : base + block[2] + block[3] - 1] += diagonal_sums(block_grad)
        probs, grad_scores = probs.view(-1, *block[2:]), grad_scores.view(-1, *block[2:])  # [bH, m, n]
        grad_value[:, keys].baddbmm_(probs.transpose(1, 2), grad_output[:, rows])
        grad_query[:, rows].baddbmm_(grad_scores, key[:, keys], beta=0.0, alpha=scale)
        grad_key[:, keys].baddbmm_(grad_scores.transpose(1, 2), scaled_query[:, rows])
    key_shape = (batch, heads, k_len, dim)
    return grad_query.view(query.shape), grad_key.view(key_shape), grad_value.view(key_shape)


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    diagonals: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """``softmax(q kᵀ / sqrt(d) + mask) v`` with ``query [b, H, q, d]``, ``key``/``value [b, H, k, d]``.

    ``mask [1, H or 1, q, k]`` (the query's dtype; not differentiated) is the Toeplitz matrix of
    ``diagonals [H or 1, q + k - 1]`` (``diagonal_gather(diagonals, q, k)[None]``), which receives the
    gradient; ``None`` when the mask needs none. The mask must hold ``-inf`` wherever query ``i`` may
    not see key ``j``: above the causal diagonal ``j > i + k - q`` and, with ``window``, at distances
    ``>= window`` (the backward pass skips those keys). Every row must see at least one key. Only
    for calls where :func:`supported` is true.
    """
    return _MaskedAttention.apply(query, key, value, diagonals, mask, window)
