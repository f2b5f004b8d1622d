"""eager, sdpa and flex compute the same attention for every registered embedding."""

from __future__ import annotations

import pytest
import torch

from kerple import positional
from kerple.model.attention import ATTENTION_IMPLS
from model_helpers import VOCAB, supported_impls, tiny_model


NAMES = positional.names()


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).norm() / reference.norm())


def _logits(name: str, impl: str, window: int | None, tokens: torch.Tensor) -> torch.Tensor:
    model = tiny_model(name, impl=impl, window=window).eval()
    with torch.no_grad():
        return model(tokens)


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("name", NAMES)
def test_outputs_agree(name: str, window: int | None) -> None:
    tokens = torch.randint(0, VOCAB, (2, 33), generator=torch.Generator().manual_seed(1))
    reference = _logits(name, "eager", window, tokens)
    others = [impl for impl in supported_impls(name) if impl != "eager"]
    assert "flex" in others
    for impl in others:
        assert _relative_error(_logits(name, impl, window, tokens), reference) <= 1e-5, impl


def test_window_changes_the_output() -> None:
    """The agreement above must not be vacuous: a window really restricts attention."""
    tokens = torch.randint(0, VOCAB, (1, 33))
    full = _logits("kerple_log", "eager", None, tokens)
    windowed = _logits("kerple_log", "eager", 7, tokens)
    torch.testing.assert_close(full[:, :7], windowed[:, :7])
    assert not torch.allclose(full[:, 7:], windowed[:, 7:], atol=1e-4)


def _gradients(name: str, impl: str, window: int | None, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    model = tiny_model(name, impl=impl, window=window).train()
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return {key: param.grad.clone() for key, param in model.named_parameters()}


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("name", [name for name in NAMES if "sdpa" in supported_impls(name)])
def test_eager_and_sdpa_gradients_agree(name: str, window: int | None) -> None:
    tokens = torch.randint(0, VOCAB, (2, 25), generator=torch.Generator().manual_seed(2))
    eager = _gradients(name, "eager", window, tokens)
    sdpa = _gradients(name, "sdpa", window, tokens)
    assert eager.keys() == sdpa.keys()
    # a gradient that is 0 up to rounding (FIRE's first-layer bias where a ReLU unit is always on: a
    # constant per head, which the softmax cancels) is compared to the largest one instead of to itself
    floor = 1e-3 * max(grad.norm() for grad in eager.values())
    for key in eager:
        assert float((sdpa[key] - eager[key]).norm() / max(eager[key].norm(), floor)) <= 1e-5, key
    if positional.family(name).learnable and positional.family(name).kind.value != "input":
        learnable = [key for key in eager if key.startswith("positional.")]
        assert learnable and all(eager[key].abs().sum() > 0 for key in learnable)


def test_compiled_flex_agrees_with_eager() -> None:
    """The real (compiled, fused) FlexAttention kernel on CPU, with a weight kernel and a window.

    ``kerple_bias_wht`` exercises both the logit scale and the bias inside ``score_mod``.
    """
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    reference = _logits("kerple_bias_wht", "eager", 9, tokens)
    model = tiny_model("kerple_bias_wht", impl="flex", window=9, flex_compile=True).eval()
    with torch.no_grad():
        flex = model(tokens)
    assert _relative_error(flex, reference) <= 1e-5
    assert model._flex.compiled and len(model._flex._block_masks) == 1


def test_all_impls_are_known() -> None:
    assert ATTENTION_IMPLS == ("eager", "sdpa", "flex", "triton")


def test_a_mask_that_needs_a_gradient_only_reaches_the_kernels_that_return_it(monkeypatch) -> None:
    """The kernel set is applied to a mask that needs a gradient and to no other: narrowed to the
    memory-efficient kernel alone, which a CPU lacks, the first finds no kernel (PyTorch says so) and the second runs."""
    from torch.nn.attention import SDPBackend

    from kerple.model import attention

    monkeypatch.setattr(attention, "MASK_GRADIENT_KERNELS", [SDPBackend.EFFICIENT_ATTENTION])
    query = torch.randn(1, 2, 8, 16, requires_grad=True)
    mask = torch.randn(1, 2, 8, 8)
    assert attention._sdpa_masked(query, query, query, mask, 0.0).shape == query.shape
    with pytest.raises(RuntimeError, match="No viable backend"):
        attention._sdpa_masked(query, query, query, mask.requires_grad_(), 0.0)
