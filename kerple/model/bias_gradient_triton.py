"""The Triton kernel of :mod:`kerple.model.bias_gradient`: one program per attention tile, one partial
sum per tile and parameter slot.

Program ``(query block, key block, batch·head)`` recomputes its ``[BLOCK_M, BLOCK_N]`` tile of the
attention backward (Dao 2023, *FlashAttention-2*, Algorithm 2; the bias as a distance table)::

    x  = q kᵀ / √d                      S  = x · scale[h, d] + bias[h, d]      (d = i - j)
    P  = exp(S - lse)                   dP = dO vᵀ
    dS = P ∘ (dP - rowsum(dO ∘ O))      partial[k] = Σ_tile dS ∘ (∂bias/∂θ_k + x · ∂scale/∂θ_k)[h, d]

and writes ``partial`` (no atomics); the caller sums the tiles in a fixed order. Tiles with no
visible score (above the causal diagonal, beyond the window) write nothing (the buffer starts at
zero); a parameter slot whose derivative is zero at every distance of the tile is skipped.

Loop bounds are compile-time constants (``tl.static_range`` over the parameter slots; the tile is
the grid): Triton's CPU interpreter (``TRITON_INTERPRET=1`` when triton is imported), where the tests
run the kernel, fails on loop bounds computed at run time with numpy 2.4. There ``UPCAST`` converts
16-bit operands to fp32 before ``tl.dot``: Triton 3.6's interpreter multiplies bf16 operands as their
raw 16-bit integers. On a GPU the operands go to the
tensor cores as they are (fp32 accumulation either way; products of 16-bit values are exact in fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tile_gradient(
    Q, K, V, DO, LSE, DELTA, BIAS, SCALE, BIAS_JAC, SCALE_JAC, SUPPORT, OUT,
    stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl,
    stride_vb, stride_vh, stride_vl, stride_ob, stride_oh, stride_ol,
    heads, length, window, key_blocks, band, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PARAMS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr,
    UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    query_block = tl.program_id(0)
    band_index = tl.program_id(1)
    batch_head = tl.program_id(2)
    first_row = query_block * BLOCK_M
    first_key_block = 0
    if HAS_WINDOW:
        first_key_block = tl.maximum(first_row - window + 1, 0) // BLOCK_N
    key_block = first_key_block + band_index
    first_col = key_block * BLOCK_N
    # distances in the tile: [first_row - first_col - BLOCK_N + 1, first_row + BLOCK_M - 1 - first_col]
    nearest = first_row - first_col - BLOCK_N + 1
    farthest = first_row + BLOCK_M - 1 - first_col
    visible = (key_block < key_blocks) & (farthest >= 0)
    if HAS_WINDOW:
        visible = visible & (nearest < window)
    if visible:
        batch = (batch_head // heads).to(tl.int64)
        head = (batch_head % heads).to(tl.int64)
        rows = first_row + tl.arange(0, BLOCK_M)
        cols = first_col + tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        row_ok = rows < length
        col_ok = cols < length
        dim_ok = dims < HEAD_DIM
        q = tl.load(Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_ql + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        do = tl.load(DO + batch * stride_ob + head * stride_oh + rows[:, None] * stride_ol + dims[None, :],
                     mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        k = tl.load(K + batch * stride_kb + head * stride_kh + cols[:, None] * stride_kl + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        v = tl.load(V + batch * stride_vb + head * stride_vh + cols[:, None] * stride_vl + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            q, do, k, v = q.to(tl.float32), do.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
        lse = tl.load(LSE + batch_head * length + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + batch_head * length + rows, mask=row_ok, other=0.0)
        distance = rows[:, None] - cols[None, :]  # [BLOCK_M, BLOCK_N]
        valid = (distance >= 0) & row_ok[:, None] & col_ok[None, :]
        if HAS_WINDOW:
            valid = valid & (distance < window)
        table_index = head * length + tl.minimum(tl.maximum(distance, 0), length - 1)
        x = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * sm_scale  # fp32 [BLOCK_M, BLOCK_N]
        score = x
        if HAS_SCALE:
            score = score * tl.load(SCALE + table_index, mask=valid, other=0.0)
        if HAS_BIAS:
            score = score + tl.load(BIAS + table_index, mask=valid, other=0.0)
        probs = tl.where(valid, tl.exp(score - lse[:, None]), 0.0)
        grad_probs = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)  # fp32 [BLOCK_M, BLOCK_N]
        grad_scores = probs * (grad_probs - delta[:, None])
        out = OUT + ((query_block * band + band_index) * tl.num_programs(2) + batch_head) * PARAMS
        for slot in tl.static_range(PARAMS):
            support_first = tl.load(SUPPORT + 2 * slot)
            support_last = tl.load(SUPPORT + 2 * slot + 1)
            if (support_first <= farthest) & (support_last >= nearest):
                jacobian_index = slot * heads * length + table_index
                derivative = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                if HAS_BIAS:
                    derivative += tl.load(BIAS_JAC + jacobian_index, mask=valid, other=0.0)
                if HAS_SCALE:
                    derivative += x * tl.load(SCALE_JAC + jacobian_index, mask=valid, other=0.0)
                tl.store(out + slot, tl.sum(tl.sum(grad_scores * derivative, axis=1), axis=0))


def tile_sizes(dtype: torch.dtype, head_dim: int) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)``: 64 x 64 in 16-bit and fp32 up to head_dim 64, 32 x 32 for wider fp32
    heads (four fp32 ``[64, 128]`` operand tiles are 128 KiB). Not tuned on a GPU yet."""
    return (32, 32) if dtype == torch.float32 and head_dim > 64 else (64, 64)


def tile_partials(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, grad_output: torch.Tensor,
    lse: torch.Tensor, delta: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None,
    bias_jacobian: torch.Tensor | None, scale_jacobian: torch.Tensor | None, support: torch.Tensor,
    window: int | None, blocks: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Partial sums ``[query blocks, key blocks in a band, b·H, P]`` float32 of the kernel (module
    docstring); ``query``, ``key``, ``value``, ``grad_output`` ``[b, H, L, d]`` with unit stride in ``d``,
    ``lse``/``delta`` ``[b, H, L]`` float32, tables ``[H, L]`` and Jacobians ``[P, H, L]`` float32,
    contiguous. On CUDA tensors, or on CPU tensors when Triton was imported with ``TRITON_INTERPRET=1``
    (its interpreter). The head dimension is padded to a power of two of at least 16 lanes (``tl.dot``'s
    smallest on NVIDIA GPUs)."""
    interpret = triton.knobs.runtime.interpret
    if query.device.type != "cuda" and not interpret:
        raise RuntimeError("the Triton bias-gradient kernel runs on CUDA, or on a CPU under TRITON_INTERPRET=1 "
                           "(set before triton is imported)")
    batch, heads, length, head_dim = query.shape
    params = support.shape[0]
    block_m, block_n = blocks or tile_sizes(query.dtype, head_dim)
    query_blocks, key_blocks = triton.cdiv(length, block_m), triton.cdiv(length, block_n)
    band = key_blocks if window is None else min(key_blocks, triton.cdiv(window + block_m - 1, block_n) + 1)
    out = torch.zeros(query_blocks, band, batch * heads, params, dtype=torch.float32, device=query.device)
    jacobian = bias_jacobian if bias_jacobian is not None else scale_jacobian
    tensors = (query, key, value, grad_output, lse, delta, _or(bias, lse), _or(scale, lse),
               _or(bias_jacobian, jacobian), _or(scale_jacobian, jacobian), support, out)
    strides = [stride for tensor in (query, key, value, grad_output) for stride in tensor.stride()[:3]]
    _tile_gradient[(query_blocks, band, batch * heads)](
        *tensors, *strides, heads, length, window or length, key_blocks, band, head_dim**-0.5,
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m, BLOCK_N=block_n,
        PARAMS=params, HAS_BIAS=bias is not None, HAS_SCALE=scale is not None, HAS_WINDOW=window is not None,
        UPCAST=interpret and query.dtype != torch.float32,
        INPUT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
    )
    return out


def _or(tensor: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a tensor the kernel never reads (its ``HAS_*`` flag is off) in its place."""
    return stand_in if tensor is None else tensor
