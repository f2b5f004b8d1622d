"""The Triton kernel of :mod:`kerple.model.bias_gradient`: the attention backward's ``dS`` summed along
each diagonal of the score matrix, one partial vector per program.

Program ``(query chunk, diagonal band, batch·head)`` walks :data:`CHUNK` query blocks of ``B`` rows; in
each it takes the ``B x B`` tile whose key block lies ``band`` blocks to the left (``key block = query
block - band``), recomputes it (Dao 2023, *FlashAttention-2*, Algorithm 2; the term as distance tables)::

    x  = q kᵀ / √d                      S  = x · scale[h, d] + bias[h, d]      (d = i - j)
    P  = exp(S - lse)                   dP = dO vᵀ
    dS = P ∘ (dP - rowsum(dO ∘ O))

Every tile of a band holds the same distance at the same place (local row ``i``, column ``j``: distance
``band·B + i - j``), so the program adds its tiles' ``dS`` (and ``dS ∘ x`` with a scale table)
elementwise into ``B x B`` accumulators, in a fixed order, and sums along the diagonals once at the
end, not once per tile: slot ``c`` of the ``[2B]`` result holds local offset ``i - j = c - B``
(``tl.gather`` of row ``i`` at column ``i + B - c``), i.e. distance ``(band - 1)·B + c``. The caller
adds the bands' halves where they overlap (:func:`diagonal_partials`). No atomics: deterministic. The buffer is
``chunks x bands x b·H x 2B`` floats per table, a vector per tile group, not a score matrix.

The loop over a chunk's tiles has run-time bounds, and ``tl.range`` asks for :data:`STAGES` pipeline stages:
compiled for sm_90, the tiles' loads become ``cp.async`` copies issued ahead of the compute. A plain
``range`` over the same bounds was left unpipelined by Triton 3.6 in 16 bits, as was the compile-time loop
with a branch inside that the kernel had before (``benchmarks/triton_resources.py``, "async copies").
Triton's CPU interpreter (``TRITON_INTERPRET=1`` when triton is imported), where the tests run the kernel,
fails on run-time loop bounds with numpy 2.4 (it converts a one-element array to an index with ``int``,
which numpy 2.4 refuses); :func:`check_device` mends that conversion, so the interpreter runs the loop a GPU
compiles. There ``UPCAST`` converts 16-bit operands to fp32 before ``tl.dot``: Triton 3.6's
interpreter multiplies bf16 operands as their raw 16-bit integers. On a GPU the operands go to the
tensor cores as they are (fp32 accumulation either way; products of 16-bit values are exact in fp32).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

CHUNK = 16  # query blocks per program: the partial buffer shrinks by this factor, the grid with it
PARTIALS_BYTES = 256 * 2**20
"""The most a partial buffer (per table) should take, here and in ``attention_impl: triton``'s backward:
beyond, a program walks more query blocks (:func:`chunk_size`) or key blocks share a row
(:func:`~kerple.model.triton_attention_kernels.key_programs`), so the buffer grows as ``L``, not ``L²``."""
STAGES = 2
"""The software pipeline's depth on a GPU: the next tile's loads issued while one computes (1: not pipelined)."""
WARPS = 8
"""Warps per program. Compiled offline for sm_90 (Triton 3.6, ``benchmarks/triton_resources.py``), eight warps
and two stages spill nothing in bf16, fp16 and fp32 at head_dims 64 and 128, with one table or two (bf16
kerple_log at head_dim 64: 177 registers a thread, 120 unpipelined); with four, the 16-bit 64 x 64 tiles
spill once a scale table is summed too. Not timed on a GPU."""
GATHER_EACH_TILE = False
"""True: sum each tile along its diagonals as it comes, as the kernel did before it added a band's
tiles first and gathered once per program. Kept so that a GPU can time both orders
(``benchmarks/bias_gradient.py``): the tile accumulators cost registers, each gather shuffles."""


@triton.jit
def tile_diagonal_sums(values, BLOCK: tl.constexpr):
    """``[2·BLOCK]``: slot ``c`` sums ``values[i, i + BLOCK - c]`` over the rows where that column exists."""
    rows = tl.arange(0, BLOCK)[:, None]
    slots = tl.arange(0, 2 * BLOCK)[None, :]
    columns = rows + BLOCK - slots  # [BLOCK, 2·BLOCK]
    inside = (columns >= 0) & (columns < BLOCK)
    gathered = tl.gather(values, tl.minimum(tl.maximum(columns, 0), BLOCK - 1), axis=1)
    return tl.sum(tl.where(inside, gathered, 0.0), axis=0)


@triton.jit
def tile_logits(q, k, rows, cols, head, length, window, BIAS, SCALE, sm_scale,
            BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr,
            INPUT_PRECISION: tl.constexpr):
    """``(x, S, visible, scale)`` of the tile of query rows ``rows`` and key columns ``cols``, each ``[B, B]``:
    ``x = q kᵀ / √d``, ``S = x · scale[h, d] + bias[h, d]`` (``scale`` 1 without a scale table), ``visible``
    the causal (and window) mask. The logits of both kernels that recompute a tile."""
    distance = rows[:, None] - cols[None, :]
    visible = (distance >= 0) & (rows < length)[:, None] & (cols < length)[None, :]
    if HAS_WINDOW:
        visible = visible & (distance < window)
    index = head * length + tl.minimum(tl.maximum(distance, 0), length - 1)
    x = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * sm_scale
    if HAS_SCALE:
        scale = tl.load(SCALE + index, mask=visible, other=0.0)
    else:
        scale = tl.full([BLOCK, BLOCK], 1.0, tl.float32)
    score = x * scale
    if HAS_BIAS:
        score = score + tl.load(BIAS + index, mask=visible, other=0.0)
    return x, score, visible, scale


@triton.jit
def _band_tile(query_block, key_block, sums, Q, K, V, DO, LSE, DELTA, BIAS, SCALE,
               stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl,
               stride_vb, stride_vh, stride_vl, stride_ob, stride_oh, stride_ol,
               batch, head, batch_head, length, window, sm_scale, dims, dim_ok,
               BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr,
               UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr, GATHER_EACH_TILE: tl.constexpr):
    """The tile of ``(query_block, key_block)`` recomputed and its ``dS`` (and ``dS ∘ x``) added into ``sums``:
    ``(bias, scale)`` tiles ``[B, B]`` added elementwise, or with ``GATHER_EACH_TILE`` diagonal sums ``[2B]``."""
    offsets = tl.arange(0, BLOCK)
    rows = query_block * BLOCK + offsets
    cols = key_block * BLOCK + offsets
    row_ok = rows < length
    col_ok = cols < length
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
    x, score, valid, _ = tile_logits(q, k, rows, cols, head, length, window, BIAS, SCALE, sm_scale,
                                     BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, INPUT_PRECISION)
    probs = tl.where(valid, tl.exp(score - lse[:, None]), 0.0)
    grad_probs = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)  # fp32 [BLOCK, BLOCK]
    grad_scores = probs * (grad_probs - delta[:, None])
    bias_part, scale_part = sums
    if GATHER_EACH_TILE:
        if HAS_BIAS:
            bias_part += tile_diagonal_sums(grad_scores, BLOCK)
        if HAS_SCALE:
            scale_part += tile_diagonal_sums(grad_scores * x, BLOCK)
    else:
        if HAS_BIAS:
            bias_part += grad_scores
        if HAS_SCALE:
            scale_part += grad_scores * x
    return bias_part, scale_part


@triton.jit
def _band_sums(
    Q, K, V, DO, LSE, DELTA, BIAS, SCALE, BIAS_OUT, SCALE_OUT,
    stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl,
    stride_vb, stride_vh, stride_vl, stride_ob, stride_oh, stride_ol,
    heads, length, window, query_blocks, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_WINDOW: tl.constexpr,
    UPCAST: tl.constexpr, INPUT_PRECISION: tl.constexpr, GATHER_EACH_TILE: tl.constexpr,
    STAGES: tl.constexpr,
):
    chunk = tl.program_id(0)
    band = tl.program_id(1)
    batch_head = tl.program_id(2)
    batch = (batch_head // heads).to(tl.int64)
    head = (batch_head % heads).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    if GATHER_EACH_TILE:  # the tiles' diagonal sums as they come
        sums = (tl.zeros([2 * BLOCK], dtype=tl.float32), tl.zeros([2 * BLOCK], dtype=tl.float32))
    else:  # the band's dS tiles, added elementwise
        sums = (tl.zeros([BLOCK, BLOCK], dtype=tl.float32), tl.zeros([BLOCK, BLOCK], dtype=tl.float32))
    for query_block in tl.range(tl.maximum(chunk * CHUNK, band), tl.minimum(chunk * CHUNK + CHUNK, query_blocks),
                                num_stages=STAGES):
        sums = _band_tile(
            query_block, query_block - band, sums, Q, K, V, DO, LSE, DELTA, BIAS, SCALE,
            stride_qb, stride_qh, stride_ql, stride_kb, stride_kh, stride_kl, stride_vb, stride_vh, stride_vl,
            stride_ob, stride_oh, stride_ol, batch, head, batch_head, length, window, sm_scale, dims, dim_ok,
            BLOCK, HAS_BIAS, HAS_SCALE, HAS_WINDOW, UPCAST, INPUT_PRECISION, GATHER_EACH_TILE)
    bias_sums, scale_sums = sums
    if not GATHER_EACH_TILE:
        if HAS_BIAS:
            bias_sums = tile_diagonal_sums(bias_sums, BLOCK)
        if HAS_SCALE:
            scale_sums = tile_diagonal_sums(scale_sums, BLOCK)
    out = ((chunk * tl.num_programs(1) + band) * tl.num_programs(2) + batch_head) * 2 * BLOCK + tl.arange(0, 2 * BLOCK)
    if HAS_BIAS:
        tl.store(BIAS_OUT + out, bias_sums)
    if HAS_SCALE:
        tl.store(SCALE_OUT + out, scale_sums)


def tile_size(dtype: torch.dtype, head_dim: int) -> int:
    """``B`` of the square ``B x B`` tiles: 64 in 16-bit, 32 in fp32 (at 64 its fp32 operand tiles spill
    registers: :data:`WARPS`). Not timed on a GPU yet."""
    return 32 if dtype == torch.float32 else 64


def check_device(query: torch.Tensor, kernel: str) -> bool:
    """Refuse a device ``kernel`` cannot run on: CUDA, or a CPU under Triton's interpreter; whether it interprets."""
    interpret = bool(triton.knobs.runtime.interpret)
    if query.device.type != "cuda" and not interpret:
        raise RuntimeError(f"{kernel} runs on CUDA, or on a CPU under TRITON_INTERPRET=1 (set before triton is imported)")
    if interpret:
        allow_run_time_loop_bounds()
    return interpret


def allow_run_time_loop_bounds() -> None:
    """Let Triton's interpreter take a loop bound computed in the kernel: it turns a tensor into an index with
    ``int(array)``, which numpy 2.4 refuses for the one-element arrays it holds scalars in; the conversion is
    made with ``.item()`` instead, in the interpreter's own patch scope (undone after each launch as its other
    patches are). Nothing to do when the interpreter no longer has that hook."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "mends_index", False):
        return

    def patched(tensor: Any, scope: Any) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched.mends_index = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


def tile_layout(length: int, block: int, window: int | None) -> tuple[int, int]:
    """``(query blocks, bands)`` of square ``block``-wide tiles over ``length`` positions: a tile of band ``n``
    holds distances ``((n - 1)·B, (n + 1)·B)``, so bands past the window see nothing."""
    if block < 16 or block & (block - 1):
        raise ValueError(f"block {block}: the tiles are 16, 32 or 64 wide (a power of two of at least 16: "
                         "tl.dot's smallest; Triton 3.6 fails to compile 8 x 8 tiles for an H200)")
    query_blocks = triton.cdiv(length, block)
    return query_blocks, query_blocks if window is None else min(query_blocks, triton.cdiv(window - 1, block) + 1)


def diagonal_partials(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, grad_output: torch.Tensor,
    lse: torch.Tensor, delta: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None,
    window: int | None, block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The kernel's partials (module docstring), float32 ``[chunks, bands, b·H, 2B]``: ``Σ dS`` with a ``bias``
    table and ``Σ dS ∘ x`` with a ``scale`` table (``None`` without it); ``query``, ``key``, ``value``, ``grad_output`` ``[b, H, L, d]`` with unit
    stride in ``d``, ``lse``/``delta`` ``[b, H, L]`` float32, tables ``[H, L]`` float32 contiguous. On CUDA
    tensors, or on CPU tensors when Triton was imported with ``TRITON_INTERPRET=1`` (its interpreter). The
    head dimension is padded to a power of two of at least 16 lanes (``tl.dot``'s smallest on NVIDIA GPUs)."""
    interpret = check_device(query, "the Triton bias-gradient kernel")
    batch, heads, length, head_dim = query.shape
    block = block or tile_size(query.dtype, head_dim)
    query_blocks, bands = tile_layout(length, block, window)
    chunk = chunk_size(query_blocks, bands, batch * heads, block)
    shape = (triton.cdiv(query_blocks, chunk), bands, batch * heads, 2 * block)
    bias_out, scale_out = (None if table is None else torch.empty(shape, dtype=torch.float32, device=query.device)
                           for table in (bias, scale))
    strides = [stride for tensor in (query, key, value, grad_output) for stride in tensor.stride()[:3]]
    _band_sums[shape[:3]](
        query, key, value, grad_output, lse, delta, _or(bias, lse), _or(scale, lse), _or(bias_out, scale_out),
        _or(scale_out, bias_out),
        *strides, heads, length, window or length, query_blocks, head_dim**-0.5,
        **_launch_settings(query.dtype, head_dim, block, chunk, bias is not None, scale is not None, window is not None,
                           interpret=interpret),
    )
    return bias_out, scale_out


def chunk_size(query_blocks: int, bands: int, batch_heads: int, block: int) -> int:
    """Query blocks a program walks: :data:`CHUNK` (all of them when fewer), doubled until the partial buffer
    of a table, ``[chunks, bands, b·H, 2B]`` float32, fits in :data:`PARTIALS_BYTES` or one chunk is left:
    at 65,536 tokens of 12 heads (``B = 64``) 32 blocks, 201 MB instead of 402."""
    chunk = min(CHUNK, query_blocks)
    row_bytes = partial_row_bytes(bands, batch_heads, block)
    while triton.cdiv(query_blocks, chunk) > 1 and triton.cdiv(query_blocks, chunk) * row_bytes > PARTIALS_BYTES:
        chunk *= 2
    return chunk


def partial_row_bytes(bands: int, batch_heads: int, block: int) -> int:
    """Bytes of one row of a partial buffer ``[rows, bands, b·H, 2B]`` float32 (both kernels' layout)."""
    return bands * batch_heads * 2 * block * 4


def _launch_settings(dtype: torch.dtype, head_dim: int, block: int, chunk: int, has_bias: bool, has_scale: bool,
                     has_window: bool, interpret: bool = False, gather_each_tile: bool | None = None) -> dict:
    """The kernel's compile-time arguments and ``num_warps`` for one launch (``interpret``: in Triton's
    interpreter)."""
    return dict(
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK=block, CHUNK=chunk,
        HAS_BIAS=has_bias, HAS_SCALE=has_scale, HAS_WINDOW=has_window, UPCAST=interpret and dtype != torch.float32,
        INPUT_PRECISION="ieee" if dtype == torch.float32 else "tf32",
        GATHER_EACH_TILE=GATHER_EACH_TILE if gather_each_tile is None else gather_each_tile,
        STAGES=STAGES,
        num_warps=WARPS,
    )


def offline_request(dtype: torch.dtype, head_dim: int, scale: bool, window: bool = False, block: int | None = None,
                    num_warps: int | None = None, gather_each_tile: bool | None = None) -> dict:
    """The arguments of :func:`kerple.measure.triton_offline.compile_here` for the kernel as
    :func:`diagonal_partials` launches it on a GPU (a bias table, and a scale table when ``scale``)."""
    element = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    pointers = dict.fromkeys(["Q", "K", "V", "DO"], f"*{element}")
    pointers.update(dict.fromkeys(["LSE", "DELTA", "BIAS", "SCALE", "BIAS_OUT", "SCALE_OUT"], "*fp32"))
    integers = ["stride_qb", "stride_qh", "stride_ql", "stride_kb", "stride_kh", "stride_kl", "stride_vb", "stride_vh",
                "stride_vl", "stride_ob", "stride_oh", "stride_ol", "heads", "length", "window", "query_blocks"]
    constexprs = _launch_settings(dtype, head_dim, block or tile_size(dtype, head_dim), CHUNK, True, scale, window,
                                  gather_each_tile=gather_each_tile)
    launched_warps = constexprs.pop("num_warps")
    return {"kernel": f"{__name__}:_band_sums", "signature": {**pointers, **dict.fromkeys(integers, "i32"), "sm_scale": "fp32"},
            "constexprs": constexprs, "num_warps": num_warps or launched_warps}


def distance_sums_from_partials(partials: torch.Tensor, heads: int, length: int) -> torch.Tensor:
    """``[H, L]``: the partials ``[chunks, bands, b·H, 2B]`` summed over chunks and batch, then each band's
    lower half (distances ``(n - 1)·B ..``) added to the previous band's upper half (``n·B ..``), all in a
    fixed order."""
    chunks, bands, batch_heads, slots = partials.shape
    block = slots // 2
    per_band = partials.sum(0).view(bands, batch_heads // heads, heads, slots).sum(1)  # [bands, H, 2B]
    sums = per_band[..., block:].clone()  # band n's distances n·B .. (n + 1)·B - 1
    sums[:-1] += per_band[1:, :, :block]  # band n + 1's lower half: the same distances
    sums = sums.transpose(0, 1).reshape(heads, bands * block)[:, :length]
    return torch.nn.functional.pad(sums, (0, length - sums.shape[1]))  # distances beyond a window: zero


def _or(tensor: torch.Tensor | None, stand_in: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a tensor the kernel never reads (its ``HAS_*`` flag is off) in its place."""
    return stand_in if tensor is None else tensor
