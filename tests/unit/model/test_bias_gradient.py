"""The distance tables' gradient summed apart from the attention kernel (:mod:`kerple.model.bias_gradient`),
its CPU path, its place in autograd and ``torch.compile``, and its use by the model's FlexAttention.

References: dense float64 attention differentiated by autograd (:mod:`bias_reference`), and the eager
kernel of the model. The Triton kernel's own tests: ``test_bias_gradient_triton.py``.
"""

from __future__ import annotations

import pytest
import torch

import kerple.model.bias_gradient as bias_gradient
from kerple.model.bias_gradient import table_gradients, with_table_gradient

from bias_reference import eager_case, gradient_errors, tables
from compiled_flex import compiled_cpu_flex
from test_flex_compiled_gradients import _model, _run, _tokens

DISTANCE_BASED = ["gauss_bias2", "gauss_bias3", "gauss_wht1", "gauss_wht2", "kerple_bias_wht", "kerple_log",
                  "kerple_log3", "kerple_power", "kerple_wht", "rpe"]


def _torch_errors(case, window):  # type: ignore[no-untyped-def]
    bias, scale = tables(case)
    grads = table_gradients(case.query, case.key, case.value, case.output.float(), case.lse.float(),
                            case.grad_output, bias, scale, window)
    return gradient_errors(case, bias, scale, *grads)


@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("name", DISTANCE_BASED)
def test_cpu_reduction_equals_autograd(name: str, window: int | None, one_thread: None) -> None:
    """Three blocks of query rows (150 = 2·64 + 22), batch 2, 3 heads, with and without a window: the tables'
    gradient, and the parameters' once autograd carries it through the embedding's tables."""
    case = eager_case(name, (2, 3, 150, 16), window=window)
    errors = _torch_errors(case, window)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize(("name", "head_dim"), [("kerple_bias_wht", 64), ("rpe", 128)])
def test_cpu_reduction_wide_heads(name: str, head_dim: int, one_thread: None) -> None:
    case = eager_case(name, (2, 4, 70, head_dim), window=30)
    errors = _torch_errors(case, 30)
    assert max(errors.values()) < 1e-4, errors


def test_identity_passes_the_output_and_returns_the_tables_gradient(one_thread: None) -> None:
    case = eager_case("kerple_bias_wht", (2, 3, 70, 16))
    bias, scale = tables(case)
    output = case.output.float().requires_grad_()
    attached = with_table_gradient(output, case.query, case.key, case.value, case.lse.float(), bias, scale, None)
    assert torch.equal(attached, output)
    grad_output, *parameter_grads = torch.autograd.grad(
        (attached * case.grad_output).sum(), [output, *case.embedding.parameters()])
    assert torch.equal(grad_output, case.grad_output)  # an identity for the attention output
    errors = {name: ((g.double() - case.gradients[name]).abs().max() / case.gradients[name].abs().max()).item()
              for name, g in zip(dict(case.embedding.named_parameters()), parameter_grads)}
    assert max(errors.values()) < 1e-4, errors


def test_identity_needs_a_table() -> None:
    case = eager_case("rpe", (1, 1, 8, 16))
    with pytest.raises(ValueError, match="needs a bias or a scale table"):
        with_table_gradient(case.output.float(), case.query, case.key, case.value, case.lse.float(), None, None, None)


def test_identity_compiles_as_one_opaque_call(one_thread: None) -> None:
    """Under ``torch.compile(fullgraph=True)`` (AOTAutograd, as a compiled layer) the custom op traces without a
    graph break and its backward still returns the tables' gradient."""
    case = eager_case("kerple_wht", (1, 2, 40, 16))
    bias, scale = tables(case)  # built outside the layers, as the model does
    assert bias is None

    def attend(output: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        attached = with_table_gradient(output * 1.0, case.query, case.key, case.value, case.lse.float(), None, scale,
                                       None)
        return (attached * case.grad_output).sum()

    output = case.output.float().requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(output, scale), scale, retain_graph=True)[0]
    expected = torch.autograd.grad(attend(output, scale), scale, retain_graph=True)[0]
    torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    errors = gradient_errors(case, None, scale, None, got)
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.parametrize("name", ["kerple_log", "rpe", "kerple_wht", pytest.param("fire", marks=pytest.mark.slow),
                                  "cable"])
def test_model_flex_uses_the_reduction_for_distance_based_terms(name: str, monkeypatch: pytest.MonkeyPatch,
                                                                one_thread: None) -> None:
    """Compiled flex training (AOTAutograd on a CPU): the kernel captures no tensor that needs a gradient for a
    distance-based term, and the reduction runs once per layer; FIRE and CABLE keep FlexAttention's own."""
    model, tokens = _model(name, 16), _tokens()
    calls, captured = [], []
    original_reduction, original_attend = bias_gradient.table_gradients, type(model._flex).attend
    monkeypatch.setattr(bias_gradient, "table_gradients",
                        lambda *args, **kwargs: calls.append(1) or original_reduction(*args, **kwargs))

    def spying_attend(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        captured.extend(tensor.requires_grad for tensor in args[5])  # q, k, v, score_mod, block_mask, captured
        return original_attend(self, *args, **kwargs)

    monkeypatch.setattr(type(model._flex), "attend", spying_attend)
    with compiled_cpu_flex(monkeypatch, model._flex):
        _run(model, "flex", tokens)
    separate = name not in ("fire", "cable")
    assert len(calls) == (model.num_layers if separate else 0)
    assert any(captured) != separate


@pytest.mark.parametrize(("name", "temperature"), [("kerple_log3", 1.0), ("kerple_bias_wht", 2.0)])
def test_separate_gradient_off_keeps_flexattentions_own(name: str, temperature: float,
                                                        monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    """``separate_gradient=False`` (for comparisons): the same gradients, through the captured tensors; with a
    softmax temperature the tables' gradient reaches the parameters through the model's division by it."""
    tokens = _tokens()
    grads = {}
    for separate in (True, False):
        model = _model(name, 16)
        model.set_temperature(temperature)
        model._flex.separate_gradient = separate
        with compiled_cpu_flex(monkeypatch, model._flex):
            grads[separate] = _run(model, "flex", tokens)[1]
    for key, expected in grads[False].items():
        torch.testing.assert_close(grads[True][key], expected, rtol=1e-5, atol=1e-7, msg=key)


def test_checkpointed_layers_get_the_same_gradient(monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    """Activation checkpointing recomputes the layer (the identity included) in the backward pass."""
    tokens = _tokens()
    grads = {}
    for checkpointed in (False, True):
        model = _model("kerple_bias_wht", 16)
        model.checkpoint_activations = checkpointed
        with compiled_cpu_flex(monkeypatch, model._flex):
            grads[checkpointed] = _run(model, "flex", tokens)[1]
    for key, expected in grads[False].items():
        torch.testing.assert_close(grads[True][key], expected, rtol=1e-6, atol=1e-8, msg=key)


def test_a_kernel_that_fails_on_the_device_falls_back_to_the_torch_sums(monkeypatch, caplog, one_thread: None) -> None:
    """A Triton kernel that does not compile on some GPU: one warning naming the error, the same sums from
    the torch reduction, and no second attempt."""
    case = eager_case("kerple_log", (2, 3, 70, 16))
    bias, scale = tables(case)
    attempts = []

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        attempts.append(1)
        raise RuntimeError("PassManager::run failed\nmore detail")

    monkeypatch.setattr(bias_gradient, "_triton_sums", failing)
    monkeypatch.setattr(bias_gradient, "_TRITON_FAILURE", [])
    delta = bias_gradient.row_terms(case.output.float(), case.grad_output)
    inputs = (case.query, case.key, case.value, case.lse.float().contiguous(), delta, case.grad_output,
              bias.detach().float().contiguous(), None, None)
    with caplog.at_level("WARNING", logger="kerple.model.bias_gradient"):
        first = bias_gradient._reduce(*inputs, triton=True)
        second = bias_gradient._reduce(*inputs, triton=True)
    assert len(attempts) == 1
    assert [r.getMessage() for r in caplog.records if "Triton" in r.getMessage()] == [
        "the Triton bias-gradient kernel failed (RuntimeError: PassManager::run failed); the positional "
        "parameters' gradient comes from the torch reduction from now on (same values, slower)"]
    errors = gradient_errors(case, bias, None, first[0], None)
    assert max(errors.values()) < 1e-4, errors
    assert torch.equal(first[0], second[0])
