"""The Triton kernel of the tables' gradient (:mod:`kerple.model.bias_gradient_triton`), run in Triton's CPU
interpreter (``TRITON_INTERPRET=1``, set by ``tests/conftest.py`` without a GPU) or on CUDA.

Against dense float64 attention differentiated by autograd (:mod:`bias_reference`): the tables' gradient and
the parameters' once autograd carries it through the embedding's tables, for every distance-based registry
entry, head_dim 64 and 128, fp32 and bf16, lengths that are not a multiple of the tile, batch 2 and 3 heads,
windows; fp32 within 1e-4 relative. Small shapes: the interpreter runs each tile in numpy.
"""

from __future__ import annotations

import pytest
import torch

from bias_reference import eager_case, gradient_errors, tables

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from kerple.model import bias_gradient_triton  # noqa: E402
from kerple.model.bias_gradient import _triton_sums, row_terms, table_gradients  # noqa: E402

pytestmark = pytest.mark.triton_kernel
DISTANCE_BASED = ["gauss_bias2", "gauss_bias3", "gauss_wht1", "gauss_wht2", "kerple_bias_wht", "kerple_log",
                  "kerple_log3", "kerple_power", "kerple_wht", "rpe"]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _move(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().float().to(DEVICE).contiguous()


def _kernel_errors(case, window, block=16, output=None):  # type: ignore[no-untyped-def]
    """Errors of the tables' gradient from the kernel's partials (on ``DEVICE``), combined as the model does."""
    bias, scale = tables(case)
    heads, length = case.query.shape[1:3]
    output = case.output.to(case.query.dtype) if output is None else output
    partials = bias_gradient_triton.diagonal_partials(
        *(t.to(DEVICE) for t in (case.query, case.key, case.value, case.grad_output)), _move(case.lse),
        _move(row_terms(output, case.grad_output)), _move(bias), _move(scale), window, block)
    grads = [None if p is None else bias_gradient_triton.distance_sums_from_partials(p, heads, length).cpu()
             for p in partials]
    return gradient_errors(case, bias, scale, *grads)


@pytest.mark.parametrize("name", DISTANCE_BASED)
def test_kernel_equals_autograd_fp32_head_dim_64(name: str) -> None:
    """40 tokens in 16 x 16 tiles (the last tiles partial), batch 2, 3 heads."""
    errors = _kernel_errors(eager_case(name, (2, 3, 40, 64)), None)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize(("name", "window"), [("kerple_bias_wht", None), ("rpe", 11), ("gauss_bias3", 16),
                                              ("gauss_wht2", 17)])
def test_kernel_equals_autograd_fp32_head_dim_128(name: str, window: int | None) -> None:
    """Windows shorter than, equal to and one past a tile."""
    errors = _kernel_errors(eager_case(name, (2, 3, 40, 128), window=window), window)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize("gather_each_tile", [False, True], ids=["gather-once", "gather-each-tile"])
@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht"])
def test_kernel_over_several_chunks(name: str, gather_each_tile: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """More query blocks than a program walks (:data:`CHUNK`, 3 here): 100 tokens in 16 x 16 tiles, 7 query
    blocks in chunks of 3, 3 and 1, a program's tiles summed along the diagonals once (the default) or tile by
    tile; a bias and a scale."""
    from kerple.model import bias_gradient_triton

    monkeypatch.setattr(bias_gradient_triton, "GATHER_EACH_TILE", gather_each_tile)
    monkeypatch.setattr(bias_gradient_triton, "CHUNK", 3)
    errors = _kernel_errors(eager_case(name, (1, 2, 100, 16)), None, block=16)
    assert max(errors.values()) < 1e-4, errors


def test_kernel_with_a_capped_partial_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cap below the buffer's size: the chunks double (3, 6, 12 query blocks) until one is left, and the
    program walks all 7 blocks; a bias and a scale table."""
    from kerple.model import bias_gradient_triton

    monkeypatch.setattr(bias_gradient_triton, "CHUNK", 3)
    monkeypatch.setattr(bias_gradient_triton, "PARTIALS_BYTES", 1)
    case = eager_case("kerple_bias_wht", (1, 2, 100, 16))
    assert bias_gradient_triton.chunk_size(7, 7, 2, 16) == 12
    errors = _kernel_errors(case, None, block=16)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize(("length", "batch_heads", "window", "expected"), [
    (512, 32 * 12, None, 8),  # 8 query blocks: fewer than CHUNK
    (16_384, 12, None, 16),  # 16 chunks x 256 bands x 12 x 128 floats: 25 MB
    (65_536, 12, None, 32),  # 64 chunks would take 402 MB > 256 MiB; 32 take 201 MB
    (131_072, 12, None, 128),  # 12.6 MB a chunk: 16 chunks (201 MB)
    (131_072, 12, 1024, 16),  # a window: 17 bands, 128 chunks take 13 MB
])
def test_chunks_grow_only_past_the_cap(length: int, batch_heads: int, window: int | None, expected: int) -> None:
    """Query blocks a program walks at ``B = 64``, worked out by hand from the buffer's size."""
    from kerple.model.bias_gradient_triton import chunk_size, tile_layout

    query_blocks, bands = tile_layout(length, 64, window)
    assert chunk_size(query_blocks, bands, batch_heads, 64) == expected


@pytest.mark.parametrize("head_dim", [8, 48])
def test_kernel_default_tiles_and_odd_head_dim(head_dim: int) -> None:
    """The kernel's own tile choice (32 x 32 in fp32) over 100 tokens, head_dim padded to 16 or 64 lanes."""
    errors = _kernel_errors(eager_case("kerple_log3", (1, 2, 100, head_dim)), None, block=None)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht", "rpe"])
def test_kernel_in_bf16_equals_the_torch_reduction(name: str, head_dim: int) -> None:
    """bf16 inputs and output (as FlexAttention returns it): the kernel and the CPU reduction compute the same
    fp32 sums of the same values; both stay near the float64 reference on the rounded inputs (the rounded
    output enters through ``rowsum(dO ∘ O)``)."""
    case = eager_case(name, (2, 3, 40, head_dim), dtype=torch.bfloat16)
    output = case.output.to(torch.bfloat16)
    bias, scale = tables(case)
    got = _triton_sums(*(t.to(DEVICE) for t in (case.query, case.key, case.value, case.grad_output)),
                       _move(case.lse), _move(row_terms(output, case.grad_output)), _move(bias), _move(scale), None)
    expected = table_gradients(case.query, case.key, case.value, output, case.lse.float(), case.grad_output, bias,
                               scale, None)
    for g, e in zip(got, expected):
        if e is not None:
            torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-4 * e.abs().max().item())
    errors = gradient_errors(case, bias, scale, *(None if g is None else g.cpu() for g in got))
    assert max(errors.values()) < 2e-2, errors


def test_cuda_entry_point_with_strided_inputs() -> None:
    """What CUDA runs (``_triton_sums``) on ``q``/``k``/``v`` viewed out of one fused ``[b, L, H, 3d]``
    projection, as the model's layers pass them, and a non-contiguous ``dO``: equal to the CPU reduction on
    contiguous copies."""
    case = eager_case("kerple_bias_wht", (2, 3, 40, 64))
    fused = torch.cat([t.transpose(1, 2) for t in (case.query, case.key, case.value)], dim=-1)  # [b, L, H, 3d]
    query, key, value = fused.transpose(1, 2).split(64, dim=-1)  # views with strides of the fused layout
    grad_output = case.grad_output.transpose(-1, -2).contiguous().transpose(-1, -2)  # unit stride along L, not d
    bias, scale = tables(case)
    output, lse = case.output.float(), case.lse.float()
    got = _triton_sums(*(t.to(DEVICE) for t in (query, key, value, grad_output)), _move(lse),
                       _move(row_terms(output, grad_output)), _move(bias), _move(scale), None)
    expected = table_gradients(case.query, case.key, case.value, output, lse, case.grad_output, bias, scale, None)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-5 * e.abs().max().item())


@pytest.mark.parametrize("block", [8, 24])
def test_tiles_narrower_than_16_or_not_a_power_of_two_are_refused(block: int) -> None:
    case = eager_case("kerple_log", (1, 2, 40, 16))
    with pytest.raises(ValueError, match=f"block {block}: the tiles are 16, 32 or 64 wide"):
        _kernel_errors(case, None, block=block)


@pytest.mark.slow
@pytest.mark.process
def test_every_launch_compiles_for_sm90_without_spilling_registers() -> None:
    """Compiled offline for an H100/H200 (Triton and its ``ptxas``, no GPU): each launch configuration of
    :func:`~kerple.model.bias_gradient_triton.diagonal_partials` compiles, spills no register, and has its loop
    over tiles software-pipelined (``cp.async`` copies issued ahead: a plain loop had none in 16 bits). The
    measurement sees both faults: 4 warps on bf16 64 x 64 tiles with a scale table spill, and 8 x 8 tiles
    fail in Triton's passes as they did on an H200."""
    from kerple.measure.triton_offline import kernel_resources

    launches = [(torch.bfloat16, 64, False, False), (torch.bfloat16, 64, True, True), (torch.bfloat16, 128, True, False),
                (torch.float16, 128, True, False), (torch.float32, 128, True, False)]
    requests = [bias_gradient_triton.offline_request(dtype, head_dim, scale, window)
                for dtype, head_dim, scale, window in launches]
    faults = [bias_gradient_triton.offline_request(torch.bfloat16, 64, True, num_warps=4),
              bias_gradient_triton.offline_request(torch.bfloat16, 16, False, block=8)]
    found = kernel_resources(requests + faults)
    for launch, resources in zip(launches, found):
        assert resources.error is None and resources.spill_stores == resources.spill_loads == 0, (launch, resources)
        assert 0 < resources.registers <= 255 and resources.shared_bytes > 0, (launch, resources)
        assert resources.async_copies > 0, (launch, resources)
    spilling, refused = found[len(launches):]
    assert spilling.error is None and spilling.spill_stores > 0, spilling
    assert refused.error is not None and "PassManager" in refused.error, refused


@triton.jit
def _prefix_sums(OUT, WIDTH: tl.constexpr):
    """``OUT[p] = Σ_{i = max(p - 2, 0)}^{p} i``: a loop whose bounds come from the program id, at run time."""
    program = tl.program_id(0)
    total = tl.zeros([WIDTH], dtype=tl.float32)
    for step in tl.range(tl.maximum(program - 2, 0), program + 1, num_stages=2):
        total += step
    tl.store(OUT + program * WIDTH + tl.arange(0, WIDTH), total)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the interpreter's conversion; a GPU compiles the loop")
def test_the_interpreter_takes_run_time_loop_bounds() -> None:
    """Under numpy 2.4 the interpreter converted a loop bound with ``int(array)`` and failed; mended, a loop from
    ``max(p - 2, 0)`` to ``p`` sums 0, 0+1, 0+1+2, 1+2+3, and mending twice wraps the interpreter once."""
    from triton.runtime import interpreter

    bias_gradient_triton.allow_run_time_loop_bounds()
    mended = interpreter._patch_lang_tensor
    bias_gradient_triton.allow_run_time_loop_bounds()
    assert interpreter._patch_lang_tensor is mended and getattr(mended, "mends_index", False)
    out = torch.zeros(4, 16)
    _prefix_sums[(4,)](out, 16)
    assert out[:, 0].tolist() == [0.0, 1.0, 3.0, 6.0] and bool((out == out[:, :1]).all())
