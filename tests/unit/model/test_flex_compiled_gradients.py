"""Compiled FlexAttention (AOTAutograd, as on a GPU) gives every parameter eager's gradient.

``LearnableKernel.logit_term`` once captured ``param.reshape(H)``, a view, and AOTAutograd left
every KERPLE parameter without a gradient (``.grad is None``) while q/k/v gradients were right;
uncompiled FlexAttention, where views are fine, did not show it. These tests compile it as CUDA
does (:mod:`compiled_flex`), at head_dim 16 and 64, for every registry entry with learnable
parameters, against the eager kernel (a dense softmax over ``scores * scale + bias``,
an independent implementation of the same logits).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from kerple import positional
from kerple.model import GPTModel
from kerple.model.dilated_attention import DilatedFlexKernel, dense_dilated_attention
from kerple.positional.logit_term import LogitTerm, kernel_tensor, unsafe_captures

from compiled_flex import compiled_cpu_flex
from rounding import rounding_bound, score_rounding_spread

LEARNABLE = [name for name in positional.names() if positional.family(name).learnable]
VOCAB, HEADS, LAYERS, LENGTH = 64, 2, 2, 40


def _model(name: str, head_dim: int) -> GPTModel:
    torch.manual_seed(0)
    hidden = HEADS * head_dim
    embedding = positional.build(name, num_heads=HEADS, head_dim=head_dim, hidden_size=hidden, max_positions=LENGTH,
                                 num_layers=LAYERS)
    return GPTModel(num_layers=LAYERS, hidden_size=hidden, num_attention_heads=HEADS, padded_vocab_size=VOCAB,
                    positional=embedding).train()


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, LENGTH + 1), generator=torch.Generator().manual_seed(1))


def _loss(model: GPTModel, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(tokens[:, :-1])
    return logits, F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def _run(model: GPTModel, impl: str, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
    model.set_attention(impl)
    model.zero_grad(set_to_none=True)
    logits, loss = _loss(model, tokens)
    loss.backward()
    return logits.detach(), {key: None if p.grad is None else p.grad.clone() for key, p in model.named_parameters()}


def _assert_relative(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> None:
    error = ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()
    assert error <= tolerance, f"{what}: max |flex - eager| / max |eager| = {error:.2e} > {tolerance:g}"


def test_learnable_entries_are_listed() -> None:
    """The parametrisation below covers the KERPLE family (a registry change cannot empty it)."""
    assert {"kerple_log", "kerple_power", "kerple_bias_wht", "gauss_bias3", "rpe", "fire", "cable"} <= set(LEARNABLE)


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "fire" else n for n in LEARNABLE])
def test_compiled_flex_gradients_equal_eager(name: str, head_dim: int, monkeypatch: pytest.MonkeyPatch,
                                             one_thread: None) -> None:
    model, tokens = _model(name, head_dim), _tokens()
    eager_logits, eager_grads = _run(model, "eager", tokens)
    with compiled_cpu_flex(monkeypatch, model._flex) as counter:
        flex_logits, flex_grads = _run(model, "flex", tokens)
    assert counter.frame_count >= 1, "FlexAttention ran compiled"
    torch.testing.assert_close(flex_logits, eager_logits, rtol=1e-5, atol=1e-5)
    for key, expected in eager_grads.items():
        if expected is None:
            continue
        assert flex_grads[key] is not None, f"{key} has an eager gradient and none through compiled flex"
        _assert_relative(flex_grads[key], expected, 1e-4, key)
    assert any(key.startswith("positional.") and g is not None for key, g in eager_grads.items()) or name == "cable", (
        "a learnable embedding's parameters get gradients")


@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht", pytest.param("fire", marks=pytest.mark.slow)])
def test_compiled_flex_training_moves_positional_parameters_as_eager(name: str, monkeypatch: pytest.MonkeyPatch,
                                                                     one_thread: None) -> None:
    """Four SGD steps through the compiled kernel: the positional parameters leave their initial
    values and land where four eager steps put them. (SGD, not Adam: Adam's normalised step turns
    a rounding-level difference in a near-zero gradient into a full step of either sign.)"""
    tokens = _tokens()
    finals = {}
    for impl in ("eager", "flex"):
        model = _model(name, 64)
        initial = {key: p.detach().clone() for key, p in model.positional.named_parameters()}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        model.set_attention(impl)
        with compiled_cpu_flex(monkeypatch, model._flex):
            for _ in range(4):
                optimizer.zero_grad(set_to_none=True)
                _loss(model, tokens)[1].backward()
                optimizer.step()
        finals[impl] = {key: p.detach().clone() for key, p in model.positional.named_parameters()}
        for key, start in initial.items():
            assert not torch.equal(finals[impl][key], start), f"{impl}: positional.{key} did not move"
    for key, expected in finals["eager"].items():
        torch.testing.assert_close(finals["flex"][key], expected, rtol=1e-4, atol=1e-6, msg=key)


def test_regular_gpt_scalars_get_their_gradient_through_compiled_flex(monkeypatch: pytest.MonkeyPatch,
                                                                     one_thread: None) -> None:
    """RegularGPT's kernel (Eq. 6.1) captures tables computed from ``r``; its gradient reaches ``r``."""
    torch.manual_seed(4)
    query, key, value = torch.randn(3, 2, 2, 1 + 40, 64).unbind(0)
    scalars = torch.nn.Parameter(torch.randn(2, 3))
    expected = torch.autograd.grad(dense_dilated_attention(query, key, value, scalars, 3, True).square().sum(), scalars)[0]
    kernel = DilatedFlexKernel(compile=True)
    with compiled_cpu_flex(monkeypatch, kernel) as counter:
        output = kernel(query.requires_grad_(), key, value, scalars, 3, True)
        (got,) = torch.autograd.grad(output.square().sum(), scalars)
    assert counter.frame_count >= 1
    _assert_relative(got, expected, 1e-4, "relative_scalars")


def test_kernel_tensor_copies_views_and_parameters_only() -> None:
    parameter = torch.nn.Parameter(torch.rand(3, 1, 1))
    view = parameter.reshape(3)
    computed = parameter.reshape(3) * 2
    plain = torch.rand(3)[:2]
    assert view._is_view() and kernel_tensor(view) is not view and not kernel_tensor(view)._is_view()
    assert kernel_tensor(parameter) is not parameter and not kernel_tensor(parameter).is_leaf
    assert kernel_tensor(computed) is computed
    assert kernel_tensor(plain) is plain  # no gradient: nothing can be lost
    copy = kernel_tensor(view)
    copy.sum().backward()
    assert torch.equal(parameter.grad, torch.ones(3, 1, 1))


def test_logit_terms_hold_no_view_however_built() -> None:
    """A term built by a new embedding straight from a parameter view is made safe by ``LogitTerm``."""
    parameter = torch.nn.Parameter(torch.rand(4, 1, 1))
    term = LogitTerm((parameter.reshape(4), parameter.float()), bias=lambda tensors, position: tensors[0][position.head])
    assert unsafe_captures(term.tensors) == []
    assert unsafe_captures(term.divide_bias(2.0).tensors) == []
    for name in LEARNABLE:
        built = _model(name, 16).positional
        terms = [built.logit_term()] + [built.layer_logit_term(0, torch.randn(1, 5, built.hidden_size))]
        for term in filter(None, terms):
            assert unsafe_captures(term.tensors) == [], name


def test_flex_kernel_refuses_an_unsafe_capture() -> None:
    """A kernel handed a parameter view directly (not through ``LogitTerm``) says what to do."""
    model = _model("kerple_log", 16)
    query = torch.randn(1, HEADS, 8, 16)
    view = model.positional.bias_p.reshape(HEADS)
    with pytest.raises(ValueError, match="kernel_tensor"):
        model._flex.attend(query, query, query, None, model._flex.block_mask(8, 8, None, query.device), (view,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht"])
def test_compiled_flex_in_half_precision_at_head_dim_128(name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch,
                                                         one_thread: None) -> None:
    """The 1.3B head dimension in bf16 and fp16, the model cast as DeepSpeed casts it (positional tensors stay
    fp32): compiled flex gives every positional parameter a gradient, within the rounding bound of eager's in
    the same dtype (:mod:`rounding`: the spread of the gradient when every score, probability and score
    gradient is off by the dtype's unit roundoff). In fp16 that bound is under 1% of the gradient, so a
    gradient scaled by 1.01 fails; bf16's unit roundoff (2⁻⁹) cannot resolve 1% of a sum that cancels as
    these do, and there the check catches a lost or wrong term."""
    model, tokens = _model(name, 128).to(dtype), _tokens()
    spread = score_rounding_spread(copy.deepcopy(model).float(), lambda fp32: _run(fp32, "eager", tokens), dtype)
    _, eager = _run(model, "eager", tokens)
    with compiled_cpu_flex(monkeypatch, model._flex):
        _, flex = _run(model, "flex", tokens)
    for key in (key for key in eager if key.startswith("positional.")):
        assert flex[key] is not None, f"{key}: no gradient through compiled flex in {dtype}"
        bound = rounding_bound(spread[key])
        error = (flex[key] - eager[key]).norm().item()
        assert error <= bound, f"{key}: |flex - eager| = {error:.3e} > {bound:.3e} (rounding bound in {dtype})"
        if dtype == torch.float16:
            assert bound < 0.01 * eager[key].norm().item(), f"{key}: the fp16 bound no longer resolves 1%"
