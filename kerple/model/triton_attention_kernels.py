"""Triton kernels of ``attention_impl: triton``: causal attention whose logits carry a distance-based term,
and whose backward also returns that term's table gradients.

FlashAttention-2 (Dao 2023): the forward is its Algorithm 1 (online softmax over key tiles, the row's
logsumexp saved), the backward its Algorithm 2 (``P`` and ``dP`` recomputed tile by tile from ``lse``). The
logits are KERPLE's (Chi et al. 2022, Eq. (2)-(4); §5.3 for the multiplicative weight kernels) as distance
tables ``bias[h, d]``, ``scale[h, d]`` (``d = i - j``)::

    x  = q kᵀ / √D                      S  = x · scale[h, d] + bias[h, d]      (causal, d < window)
    P  = exp(S - lse)                   dP = dO vᵀ            dS = P ∘ (dP - rowsum(dO ∘ O))
    dq = (dS ∘ scale) k / √D            dk = (dS ∘ scale)ᵀ q / √D               dv = Pᵀ dO
    dbias[h, d] = Σ_{b, i - j = d} dS           dscale[h, d] = Σ_{b, i - j = d} dS ∘ x

Tiles are square (``B x B``), so the tile of query block ``m`` and key block ``n`` lies on band ``m - n``
and holds distance ``band·B + i - j`` at local ``(i, j)``. The key-side backward program, which walks the
query blocks of its key block band by band, sums each tile's ``dS`` (and ``dS ∘ x``) along its diagonals
(:func:`~kerple.model.bias_gradient_triton.tile_diagonal_sums`) into its own ``[2B]`` slot of a partial
buffer ``[key blocks, bands, b·H, 2B]``; the caller adds the partials in a fixed order
(:func:`~kerple.model.bias_gradient_triton.distance_sums_from_partials`). No atomics anywhere, so the
gradients are deterministic: ``dq`` comes from a second program per query block (Algorithm 2's ``dQ`` as a
loop of its own, rather than atomic adds). The buffer holds ``b·H·L²·2/B`` floats (``2·L·W/B`` per
``b·H`` with a window): 12.6 MB for 32 x 12 heads x 512 tokens at ``B = 64``. Past 256 MB a table
(``PARTIALS_BYTES``) programs share key blocks, each adding its blocks' sums into its one row of the buffer,
in a fixed order: at 65,536 tokens of 12 heads, 86 rows (540 MB) instead of 1,024 (6.4 GB), so long
sequences train with a buffer that grows as ``L``, not ``L²``.

Each kernel's loop over tiles runs over the causal band's blocks, bounds computed at run time: a plain loop,
which Triton's software pipeliner overlaps with its loads (compiled for sm_90, the tiles' loads become
``cp.async`` copies issued a stage ahead; a compile-time count with a branch inside, the kernels' first form,
left every load waiting for the compute before it: ``benchmarks/triton_resources.py --kernel attention``,
"async copies"). Triton's CPU interpreter, where the tests run these kernels, needs its conversion of a tensor
to an index mended for numpy 2.4 (:func:`~kerple.model.bias_gradient_triton.allow_run_time_loop_bounds`);
it then runs the loops a GPU compiles. In the interpreter ``UPCAST`` converts 16-bit operands to fp32
before ``tl.dot`` (the interpreter multiplies bf16 operands as raw 16-bit integers); on a GPU they reach the
tensor cores as they are, fp32 accumulation either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kerple.model import bias_gradient_triton
from kerple.model.bias_gradient_triton import (check_device, distance_sums_from_partials, partial_row_bytes,
                                                tile_diagonal_sums, tile_layout, tile_logits)

PIPELINED = True
"""``False``: one pipeline stage, the loops' loads not issued ahead (``benchmarks/bias_gradient.py`` times both)."""
KEY_PROGRAMS = 1024
"""The fewest key-side programs (all batch·heads together) when key blocks share one: several per SM of an
H100 or H200 (132), so sharing them keeps the GPU busy. Not timed on a GPU."""
MASKED = tl.constexpr(-1.0e30)  # a finite "minus infinity": a row with no visible key yet keeps exp() finite


@triton.jit
def _head_start(batch_head, heads, stride_batch, stride_head):
    """Where the ``[L, D]`` matrix of ``batch_head`` starts in a ``[b, H, L, D]`` tensor of these strides."""
    return (batch_head // heads).to(tl.int64) * stride_batch + (batch_head % heads).to(tl.int64) * stride_head


@triton.jit
def _load_tile(pointer, rows, row_ok, dims, dim_ok, row_stride, UPCAST: tl.constexpr):
    """Rows ``rows`` of an ``[L, D]`` matrix whose rows are ``row_stride`` apart (unit stride along ``D``),
    ``[B, BLOCK_D]``, zero outside."""
    tile = tl.load(pointer + rows[:, None] * row_stride + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :],
                   other=0.0)
    if UPCAST:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def _program_tiles(block, heads, length, stride_batch, stride_head, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK: tl.constexpr):
    """What every program starts from: its batch·head, head (int64), where that head's ``[L, D]`` matrix starts
    (these strides), the head dimension's indices and mask, and block ``block``'s positions and mask."""
    batch_head = tl.program_id(1)
    head = (batch_head % heads).to(tl.int64)
    base = _head_start(batch_head, heads, stride_batch, stride_head)
    dims = tl.arange(0, BLOCK_D)
    positions = block * BLOCK + tl.arange(0, BLOCK)
    return batch_head, head, base, dims, dims < HEAD_DIM, positions, positions < length


@triton.jit
def _row_statistics(LSE, DELTA, batch_head, length, rows, row_ok):
    """``lse`` and ``rowsum(dO ∘ O)`` of the rows ``rows``."""
    start = batch_head.to(tl.int64) * length
    return (tl.load(LSE + start + rows, mask=row_ok, other=0.0),
            tl.load(DELTA + start + rows, mask=row_ok, other=0.0))


@triton.jit
def _key_tile(q, key_block, K, V, BIAS, SCALE, base, rows, dims, dim_ok, head, length, window, sm_scale, qkv_row,
              BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr,
              UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Key block ``key_block``'s ``k`` and ``v`` tiles and its logits against the rows' ``q``:
    ``(k, v, S, visible, scale)`` (:func:`~kerple.model.bias_gradient_triton.tile_logits`)."""
    cols = key_block * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < length
    k = _load_tile(K + base, cols, col_ok, dims, dim_ok, qkv_row, UPCAST)
    v = _load_tile(V + base, cols, col_ok, dims, dim_ok, qkv_row, UPCAST)
    _, score, visible, scale = tile_logits(q, k, rows, cols, head, length, window, BIAS, SCALE, sm_scale,
                                       BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, INPUT_PRECISION)
    return k, v, score, visible, scale


@triton.jit
def _forward_tile(q, key_block, row_max, row_sum, acc, K, V, BIAS, SCALE, base, rows, dims, dim_ok, head, length,
                  window, sm_scale, qkv_row, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
                  HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Algorithm 1's update for key block ``key_block``: the rows' running max, sum and output accumulator."""
    _, v, score, visible, _ = _key_tile(q, key_block, K, V, BIAS, SCALE, base, rows, dims, dim_ok, head, length,
                                        window, sm_scale, qkv_row, BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, UPCAST,
                                        INPUT_PRECISION)
    score = tl.where(visible, score, MASKED)
    new_max = tl.maximum(row_max, tl.max(score, axis=1))
    probs = tl.where(visible, tl.exp(score - new_max[:, None]), 0.0)
    correction = tl.exp(row_max - new_max)
    row_sum = row_sum * correction + tl.sum(probs, axis=1)
    acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return new_max, row_sum, acc


@triton.jit
def _forward(
    Q, K, V, BIAS, SCALE, OUT, LSE, heads, length, window, bands, sm_scale, qkv_batch, qkv_head, qkv_row,
    out_batch, out_head, out_row,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Algorithm 1 for query block ``program_id(0)`` of batch·head ``program_id(1)``: ``OUT`` and ``LSE``."""
    query_block = tl.program_id(0)
    batch_head, head, base, dims, dim_ok, rows, row_ok = _program_tiles(query_block, heads, length, qkv_batch,
                                                                        qkv_head, HEAD_DIM, BLOCK_D, BLOCK)
    q = _load_tile(Q + base, rows, row_ok, dims, dim_ok, qkv_row, UPCAST)
    row_max = tl.full([BLOCK], MASKED, tl.float32)
    row_sum = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    for key_block in range(tl.maximum(query_block - (bands - 1), 0), query_block + 1):
        row_max, row_sum, acc = _forward_tile(
            q, key_block, row_max, row_sum, acc, K, V, BIAS, SCALE, base, rows, dims, dim_ok, head, length,
            window, sm_scale, qkv_row, BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, UPCAST, INPUT_PRECISION)
    row_sum = tl.where(row_ok, row_sum, 1.0)  # rows past the end see no key; they are not stored
    out = acc / row_sum[:, None]
    tl.store(OUT + _head_start(batch_head, heads, out_batch, out_head) + rows[:, None] * out_row + dims[None, :],
             out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(LSE + batch_head.to(tl.int64) * length + rows, row_max + tl.log(row_sum), mask=row_ok)


@triton.jit
def _backward_keys_tile(k, v, query_block, band, slot_row, grad_key, grad_value, Q, DO, LSE, DELTA, BIAS, SCALE,
                        BIAS_OUT, SCALE_OUT, batch_head, head, base, grad_base, dims, dim_ok, cols, length, window,
                        sm_scale, qkv_row, do_row, bands, BLOCK: tl.constexpr,
                        HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr,
                        UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr, ACCUMULATE: tl.constexpr):
    """Algorithm 2's inner step for query block ``query_block`` (on band ``band``): ``dK`` and ``dV`` so far, and
    the tile's diagonal sums of ``dS`` (and ``dS ∘ x``) in slot ``(slot_row, band)`` of the partial buffers
    (added to what the slot holds with ``ACCUMULATE``)."""
    rows = query_block * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < length
    q = _load_tile(Q + base, rows, row_ok, dims, dim_ok, qkv_row, UPCAST)
    do = _load_tile(DO + grad_base, rows, row_ok, dims, dim_ok, do_row, UPCAST)
    lse, delta = _row_statistics(LSE, DELTA, batch_head, length, rows, row_ok)
    x, score, visible, scale = tile_logits(q, k, rows, cols, head, length, window, BIAS, SCALE, sm_scale,
                                       BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, INPUT_PRECISION)
    probs = tl.where(visible, tl.exp(tl.where(visible, score - lse[:, None], MASKED)), 0.0)
    grad_probs = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
    grad_scores = probs * (grad_probs - delta[:, None])  # dS [B, B]
    grad_value += tl.dot(tl.trans(probs.to(do.dtype)), do, input_precision=INPUT_PRECISION)
    grad_key += tl.dot(tl.trans((grad_scores * scale).to(q.dtype)), q, input_precision=INPUT_PRECISION)
    slot = ((slot_row * bands + band) * tl.num_programs(1) + batch_head).to(tl.int64) * 2 * BLOCK
    if HAS_BIAS:
        _into_slot(BIAS_OUT + slot, tile_diagonal_sums(grad_scores, BLOCK), BLOCK, ACCUMULATE)
    if HAS_SCALE:
        _into_slot(SCALE_OUT + slot, tile_diagonal_sums(grad_scores * x, BLOCK), BLOCK, ACCUMULATE)
    return grad_key, grad_value


@triton.jit
def _into_slot(pointer, sums, BLOCK: tl.constexpr, ACCUMULATE: tl.constexpr):
    """Store the ``[2B]`` ``sums`` at ``pointer``, with ``ACCUMULATE`` added to what is there."""
    offsets = tl.arange(0, 2 * BLOCK)
    if ACCUMULATE:
        sums += tl.load(pointer + offsets)
    tl.store(pointer + offsets, sums)


@triton.jit
def _backward_keys(
    Q, K, V, DO, LSE, DELTA, BIAS, SCALE, DK, DV, BIAS_OUT, SCALE_OUT, heads, length, window, bands, sm_scale,
    qkv_batch, qkv_head, qkv_row, do_batch, do_head, do_row, first_block,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, ACCUMULATE: tl.constexpr,
):
    """Algorithm 2's outer loop for key block ``first_block + program_id(0)``, band by band: ``dK``, ``dV``
    (contiguous) and each tile's diagonal sums into slot ``(program_id(0), band, batch·head)`` of the partial
    buffers (added to what is there with ``ACCUMULATE``: :func:`key_programs`); a key block past the end has
    no tile and stores nothing."""
    key_block = tl.program_id(0)
    if ACCUMULATE:  # without, the kernel compiles as if first_block were not there (it is 0)
        key_block += first_block
    batch_head, head, base, dims, dim_ok, cols, col_ok = _program_tiles(key_block, heads, length, qkv_batch,
                                                                        qkv_head, HEAD_DIM, BLOCK_D, BLOCK)
    grad_base = _head_start(batch_head, heads, do_batch, do_head)
    k = _load_tile(K + base, cols, col_ok, dims, dim_ok, qkv_row, UPCAST)
    v = _load_tile(V + base, cols, col_ok, dims, dim_ok, qkv_row, UPCAST)
    grad_key = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    grad_value = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    for query_block in range(key_block, tl.minimum(key_block + bands, tl.cdiv(length, BLOCK))):
        grad_key, grad_value = _backward_keys_tile(
            k, v, query_block, query_block - key_block, tl.program_id(0), grad_key, grad_value, Q, DO, LSE, DELTA,
            BIAS, SCALE, BIAS_OUT, SCALE_OUT, batch_head, head, base, grad_base, dims, dim_ok, cols, length, window,
            sm_scale, qkv_row, do_row, bands, BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, UPCAST, INPUT_PRECISION,
            ACCUMULATE)
    pointers = batch_head.to(tl.int64) * length * HEAD_DIM + cols[:, None] * HEAD_DIM + dims[None, :]
    tile_ok = col_ok[:, None] & dim_ok[None, :]
    tl.store(DK + pointers, (grad_key * sm_scale).to(DK.dtype.element_ty), mask=tile_ok)
    tl.store(DV + pointers, grad_value.to(DV.dtype.element_ty), mask=tile_ok)


@triton.jit
def _backward_queries_tile(q, do, lse, delta, key_block, grad_query, K, V, BIAS, SCALE, base, rows, dims, dim_ok,
                           head, length, window, sm_scale, qkv_row, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
                           HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr,
                           INPUT_PRECISION: tl.constexpr):
    """Algorithm 2's ``dQ`` update for key block ``key_block``."""
    k, v, score, visible, scale = _key_tile(q, key_block, K, V, BIAS, SCALE, base, rows, dims, dim_ok, head, length,
                                            window, sm_scale, qkv_row, BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, UPCAST,
                                            INPUT_PRECISION)
    probs = tl.where(visible, tl.exp(tl.where(visible, score - lse[:, None], MASKED)), 0.0)
    grad_probs = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
    grad_logits = probs * (grad_probs - delta[:, None]) * scale  # dS ∘ scale, the gradient of x
    return grad_query + tl.dot(grad_logits.to(k.dtype), k, input_precision=INPUT_PRECISION)


@triton.jit
def _backward_queries(
    Q, K, V, DO, LSE, DELTA, BIAS, SCALE, DQ, heads, length, window, bands, sm_scale, qkv_batch, qkv_head, qkv_row,
    do_batch, do_head, do_row,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr, UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """``dQ`` (contiguous) of query block ``program_id(0)``: Algorithm 2's inner update, looped over the key
    blocks in ascending order."""
    query_block = tl.program_id(0)
    batch_head, head, base, dims, dim_ok, rows, row_ok = _program_tiles(query_block, heads, length, qkv_batch,
                                                                        qkv_head, HEAD_DIM, BLOCK_D, BLOCK)
    q = _load_tile(Q + base, rows, row_ok, dims, dim_ok, qkv_row, UPCAST)
    do = _load_tile(DO + _head_start(batch_head, heads, do_batch, do_head), rows, row_ok, dims, dim_ok, do_row,
                    UPCAST)
    lse, delta = _row_statistics(LSE, DELTA, batch_head, length, rows, row_ok)
    grad_query = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    for key_block in range(tl.maximum(query_block - (bands - 1), 0), query_block + 1):
        grad_query = _backward_queries_tile(
            q, do, lse, delta, key_block, grad_query, K, V, BIAS, SCALE, base, rows, dims, dim_ok, head,
            length, window, sm_scale, qkv_row, BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, UPCAST, INPUT_PRECISION)
    pointers = batch_head.to(tl.int64) * length * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
    tl.store(DQ + pointers, (grad_query * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def key_programs(blocks: int, bands: int, batch_heads: int, block: int) -> int:
    """Key-side backward programs per batch·head: one per key block while the partial buffer of a table,
    ``[programs, bands, b·H, 2B]`` float32, stays within
    :data:`~kerple.model.bias_gradient_triton.PARTIALS_BYTES`; beyond, as few as fit in it, but never fewer
    than :data:`KEY_PROGRAMS` over all batch·heads (the kernel is then launched once per ``P`` key blocks, in
    order, program ``p`` of each launch adding into row ``p``). So the buffer grows as ``L²/B`` up to the cap,
    then as ``L``. One program per key block takes 12.6 MB at 512 tokens of 32 x 12 heads (``B = 64``) and would
    take 403 MB at 16,384 tokens of 12 heads, where 170 programs share the 256 key blocks (267 MB)."""
    cap = bias_gradient_triton.PARTIALS_BYTES
    row_bytes = partial_row_bytes(bands, batch_heads, block)
    if blocks * row_bytes <= cap:
        return blocks
    return min(blocks, max(cap // row_bytes, triton.cdiv(KEY_PROGRAMS, batch_heads)))


def tile_size(dtype: torch.dtype, head_dim: int) -> int:
    """``B``: 64 for 16-bit inputs at head_dim 64, else 32 (fp32 operand tiles, or 128-wide heads, would hold
    too many registers at 64). Not timed on a GPU yet."""
    return 64 if dtype != torch.float32 and head_dim <= 64 else 32


def launch_settings(dtype: torch.dtype, head_dim: int, length: int, has_bias: bool, has_scale: bool,
                    window: int | None, block: int | None = None, interpret: bool = False) -> dict:
    """The compile-time arguments, ``num_warps`` and ``num_stages`` shared by the three kernels, chosen from
    their compilation offline for sm_90 (Triton 3.6, ``benchmarks/triton_resources.py --kernel attention``); not
    timed on a GPU. Eight warps: with four, every 16-bit configuration at head_dim 64 spills in the key-side
    backward. In 16 bits two pipeline stages (the key tiles' loads issued one tile ahead): with a bias table
    alone nothing spills, at head_dims 64 and 128; with both tables at head_dim 64 the key-side backward spills
    60 B a thread and the query-side one 32 B. fp32: Triton's three at head_dim 64
    (8 B spilled), one (loads not overlapped) at 128, where three spill 900 B in the key-side backward and one
    252 B."""
    block = block or tile_size(dtype, head_dim)
    tile_layout(length, block, window)  # refuses a tile width the kernels cannot take
    return dict(
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK=block,
        HAS_BIAS=has_bias, HAS_SCALE=has_scale, HAS_WINDOW=window is not None,
        UPCAST=interpret and dtype != torch.float32,
        INPUT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
        num_warps=8, num_stages=(2 if dtype != torch.float32 else 3 if head_dim <= 64 else 1) if PIPELINED else 1,
    )


def _settings(query: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
              block: int | None) -> dict:
    """:func:`launch_settings` for these inputs, on a device the kernels can run on."""
    interpret = check_device(query, "attention_impl triton")
    return launch_settings(query.dtype, query.shape[-1], query.shape[-2], bias is not None, scale is not None, window,
                           block, interpret)


def offline_requests(dtype: torch.dtype, head_dim: int, has_scale: bool, length: int = 512,
                     window: int | None = None, num_warps: int | None = None,
                     accumulate: bool = False) -> dict[str, dict]:
    """Per kernel, the arguments of :func:`kerple.measure.triton_offline.compile_here` for a launch on a GPU
    with a bias table (and a scale table when ``has_scale``); ``accumulate``: the key-side backward as it runs
    when key blocks share the partial buffer's rows (:func:`key_programs`)."""
    element = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    constexprs = launch_settings(dtype, head_dim, length, True, has_scale, window)
    warps, stages = constexprs.pop("num_warps"), constexprs.pop("num_stages")
    strides = [f"{t}_{axis}" for t in ("qkv", "out", "do") for axis in ("batch", "head", "row")]
    integers = dict.fromkeys(["heads", "length", "window", "bands", "first_block", *strides], "i32")
    tables = dict.fromkeys(["BIAS", "SCALE", "LSE", "DELTA", "BIAS_OUT", "SCALE_OUT"], "*fp32")
    signatures = {
        "_forward": ["Q", "K", "V", "OUT"], "_backward_keys": ["Q", "K", "V", "DO", "DK", "DV"],
        "_backward_queries": ["Q", "K", "V", "DO", "DQ"],
    }
    requests = {}
    for name, tensors in signatures.items():
        kernel = globals()[name]
        signature = {**dict.fromkeys(tensors, f"*{element}"), **tables, **integers, "sm_scale": "fp32"}
        own = {**constexprs, **({"ACCUMULATE": accumulate} if name == "_backward_keys" else {})}
        signature = {param: signature[param] for param in kernel.arg_names if param not in own}
        requests[name] = {"kernel": f"{__name__}:{name}", "signature": signature, "constexprs": own,
                          "num_warps": num_warps or warps, "num_stages": stages}
    return requests


def _shared(query: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None,
            window: int | None, block: int) -> tuple:
    """The run-time arguments after the tensors: the tables (contiguous; ``LSE``-typed stand-ins when absent:
    the kernel never reads them), heads, length, window, the causal band's width in tiles
    (:func:`~kerple.model.bias_gradient_triton.tile_layout`), ``1/√D`` and the strides of ``query`` (which
    ``key`` and ``value`` share: :func:`strided_inputs`) along batch, head and row. All run-time, so lengths
    share a compiled kernel (Triton still specializes an integer on its divisibility by 16)."""
    stand_in = query.new_empty(1, dtype=torch.float32)
    tables = tuple(stand_in if t is None else t.contiguous() for t in (bias, scale))
    heads, length, head_dim = query.shape[1:]
    bands = tile_layout(length, block, window)[1]
    return tables, (heads, length, window or length, bands, head_dim**-0.5, *query.stride()[:3])


def strided_inputs(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` as the kernels read them: as they are when they share one layout with unit stride along the
    head dimension (``q``, ``k``, ``v`` as views of the model's fused projection), else contiguous copies."""
    layout = tensors[0].stride()
    if layout[-1] == 1 and all(t.stride() == layout for t in tensors):
        return list(tensors)
    return [t.contiguous() for t in tensors]


def unit_stride(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with unit stride along its last dimension (a copy only when it lacks one)."""
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def output_like(query: torch.Tensor) -> torch.Tensor:
    """An uninitialised ``[b, H, L, D]`` output laid out as ``[b, L, H, D]``: the model's ``transpose(1, 2)``
    then ``reshape`` to ``[b, L, H·D]`` is a view, not a copy."""
    batch, heads, length, head_dim = query.shape
    return query.new_empty(batch, length, heads, head_dim).transpose(1, 2)


def attention_forward(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
    scale: torch.Tensor | None, window: int | None, block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output [b, H, L, D] in the inputs' dtype, lse [b, H, L] float32)`` of causal attention with logits
    ``x · scale[h, i - j] + bias[h, i - j]``, for ``query``/``key``/``value`` ``[b, H, L, D]`` (any strides:
    :func:`strided_inputs`) and float32 tables ``[H, L]`` (either may be ``None``); the output is laid out as
    :func:`output_like`."""
    query, key, value = strided_inputs(query, key, value)
    settings = _settings(query, bias, scale, window, block)
    batch, heads, length, _ = query.shape
    output = output_like(query)
    lse = torch.empty(batch, heads, length, dtype=torch.float32, device=query.device)
    tables, scalars = _shared(query, bias, scale, window, settings["BLOCK"])
    grid = (triton.cdiv(length, settings["BLOCK"]), batch * heads)
    _forward[grid](query, key, value, *tables, output, lse, *scalars, *output.stride()[:3], **settings)
    return output, lse


def attention_backward(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, lse: torch.Tensor,
    grad_output: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(dq, dk, dv, dbias, dscale)`` of :func:`attention_forward` for ``grad_output`` (any strides, as the
    inputs); ``dq``, ``dk``, ``dv`` are contiguous, the table gradients float32 ``[H, L]`` summed over the batch,
    ``None`` for an absent table."""
    query, key, value = strided_inputs(query, key, value)
    grad_output, lse = unit_stride(grad_output), lse.contiguous()
    settings = _settings(query, bias, scale, window, block)
    batch, heads, length, _ = query.shape
    delta = (grad_output.float() * output.float()).sum(-1)  # rowsum(dO ∘ O) [b, H, L]
    grads = [query.new_empty(query.shape) for _ in range(3)]
    blocks, bands = tile_layout(length, settings["BLOCK"], window)
    programs = key_programs(blocks, bands, batch * heads, settings["BLOCK"])
    partial_shape = (programs, bands, batch * heads, 2 * settings["BLOCK"])
    partials = [None if t is None else torch.zeros(partial_shape, dtype=torch.float32, device=query.device)
                for t in (bias, scale)]
    tables, scalars = _shared(query, bias, scale, window, settings["BLOCK"])
    outs = tuple(delta if p is None else p for p in partials)  # stand-ins are never written
    inputs = (query, key, value, grad_output, lse, delta, *tables)
    scalars = (*scalars, *grad_output.stride()[:3])
    for first_block in range(0, blocks, programs):  # one launch unless key blocks share rows; then in order
        _backward_keys[(programs, batch * heads)](*inputs, grads[1], grads[2], *outs, *scalars, first_block,
                                                  ACCUMULATE=programs < blocks, **settings)
    _backward_queries[(blocks, batch * heads)](*inputs, grads[0], *scalars, **settings)
    table_grads = [None if p is None else distance_sums_from_partials(p, heads, length) for p in partials]
    return grads[0], grads[1], grads[2], table_grads[0], table_grads[1]
