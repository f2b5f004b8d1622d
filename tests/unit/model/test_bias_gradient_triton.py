"""The Triton kernel of the positional-gradient reduction (:mod:`kerple.model.bias_gradient_triton`), run in
Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by ``tests/conftest.py`` without a GPU) or on CUDA.

Against dense float64 attention differentiated by autograd (:mod:`bias_reference`): every distance-based
registry entry, head_dim 64 and 128, fp32 and bf16, lengths that are not a multiple of the tile, batch 2
and 3 heads, a window; fp32 within 1e-4 relative. Small shapes: the interpreter runs each tile in numpy.
"""

from __future__ import annotations

import pytest
import torch

from kerple.positional.jacobian import distance_jacobian

from bias_reference import eager_case, parameter_errors

triton = pytest.importorskip("triton")
from kerple.model import bias_gradient_triton  # noqa: E402
from kerple.model.bias_gradient import parameter_gradient, row_terms  # noqa: E402

pytestmark = pytest.mark.triton_kernel
DISTANCE_BASED = ["gauss_bias2", "gauss_bias3", "gauss_wht1", "gauss_wht2", "kerple_bias_wht", "kerple_log",
                  "kerple_log3", "kerple_power", "kerple_wht", "rpe"]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _kernel_gradient(case, window, blocks=(16, 16), output=None):  # type: ignore[no-untyped-def]
    """``dθ [P, H]`` from the kernel's partials (on ``DEVICE``), and the Jacobian whose ``theta`` receives it."""
    length = case.query.shape[-2]
    jacobian = distance_jacobian(case.embedding, length, torch.device("cpu"))
    tables = jacobian.tables
    output = case.output.to(case.query.dtype) if output is None else output
    move = lambda tensor: None if tensor is None else tensor.to(DEVICE)  # noqa: E731
    partials = bias_gradient_triton.tile_partials(
        *(move(t) for t in (case.query, case.key, case.value, case.grad_output)), move(case.lse.float()),
        move(row_terms(output, case.grad_output)), move(tables.bias), move(tables.scale),
        move(tables.bias_jacobian), move(tables.scale_jacobian), move(tables.support), window, blocks)
    batch, heads = case.query.shape[:2]
    return jacobian, partials.sum((0, 1)).view(batch, heads, -1).sum(0).T.cpu()


@pytest.mark.parametrize("name", DISTANCE_BASED)
def test_kernel_equals_autograd_fp32_head_dim_64(name: str) -> None:
    """40 tokens in 16 x 16 tiles (the last tiles partial), batch 2, 3 heads."""
    case = eager_case(name, (2, 3, 40, 64))
    jacobian, grad_theta = _kernel_gradient(case, None)
    errors = parameter_errors(case, jacobian.theta, grad_theta)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize(("name", "window"), [("kerple_bias_wht", None), ("rpe", 11), ("gauss_bias3", 11)])
def test_kernel_equals_autograd_fp32_head_dim_128(name: str, window: int | None) -> None:
    case = eager_case(name, (2, 3, 40, 128), window=window)
    jacobian, grad_theta = _kernel_gradient(case, window)
    errors = parameter_errors(case, jacobian.theta, grad_theta)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize("head_dim", [8, 48])
def test_kernel_default_tiles_and_odd_head_dim(head_dim: int) -> None:
    """The kernel's own tile choice (64 x 64 in fp32) over 100 tokens, head_dim padded to 16 or 64 lanes."""
    case = eager_case("kerple_log3", (1, 2, 100, head_dim))
    jacobian, grad_theta = _kernel_gradient(case, None, blocks=None)
    errors = parameter_errors(case, jacobian.theta, grad_theta)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht", "rpe"])
def test_kernel_in_bf16_equals_the_torch_reduction(name: str, head_dim: int) -> None:
    """bf16 inputs and output (as FlexAttention returns it): the kernel and the CPU reduction compute the same
    fp32 sums of the same values; both stay near the float64 reference on the rounded inputs (the rounded
    output enters through ``rowsum(dO ∘ O)``)."""
    case = eager_case(name, (2, 3, 40, head_dim), dtype=torch.bfloat16)
    output = case.output.to(torch.bfloat16)
    jacobian, grad_theta = _kernel_gradient(case, None, output=output)
    reduction = parameter_gradient(case.query, case.key, case.value, output, case.lse.float(), case.grad_output,
                                   jacobian.tables, None)
    torch.testing.assert_close(grad_theta, reduction, rtol=1e-4, atol=1e-4 * reduction.abs().max().item())
    errors = parameter_errors(case, jacobian.theta, grad_theta)
    assert max(errors.values()) < 2e-2, errors


def test_cuda_entry_point_with_strided_inputs() -> None:
    """What CUDA runs (``_triton_gradient``: partials summed over tiles and batch) on ``q``/``k``/``v`` viewed out of
    one fused ``[b, L, H, 3d]`` projection, as the model's layers pass them, and a non-contiguous ``dO``: equal
    to the CPU reduction on contiguous copies."""
    from kerple.model.bias_gradient import _triton_gradient

    case = eager_case("kerple_bias_wht", (2, 3, 40, 64))
    fused = torch.cat([t.transpose(1, 2) for t in (case.query, case.key, case.value)], dim=-1)  # [b, L, H, 3d]
    query, key, value = fused.transpose(1, 2).split(64, dim=-1)  # views with strides of the fused layout
    grad_output = case.grad_output.transpose(-1, -2).contiguous().transpose(-1, -2)  # unit stride along L, not d
    jacobian = distance_jacobian(case.embedding, 40, torch.device("cpu"))
    output, lse = case.output.float(), case.lse.float()
    move = lambda tensor: None if tensor is None else tensor.to(DEVICE)  # noqa: E731
    tables = type(jacobian.tables)(*(move(getattr(jacobian.tables, f)) for f in
                                     ("bias", "scale", "bias_jacobian", "scale_jacobian", "support")))
    got = _triton_gradient(*(move(t) for t in (query, key, value, grad_output, lse)),
                           move(row_terms(output, grad_output)), tables, None).cpu()
    expected = parameter_gradient(case.query, case.key, case.value, output, lse, case.grad_output,
                                  jacobian.tables, None)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
