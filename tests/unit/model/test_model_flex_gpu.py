"""FlexAttention training on CUDA: logits and gradients (incl. learnable positional parameters) match eager.

Every registry entry. In fp32 the comparison is tight. In half precision a fixed tolerance on
gradients that are sums of many cancelling terms (a KERPLE exponent's gradient, say) decides on
rounding noise. The model is cast to the half dtype as DeepSpeed's bf16 / fp16 modes do
(positional tensors stay fp32). A positional parameter's gradient through flex must lie within the
rounding bound of eager's in the same dtype (:mod:`rounding`: the spread of the gradient when every
score, probability and score gradient is off by the dtype's unit roundoff). Logits and the other
gradients, whose terms do not cancel so, are judged against eager fp32 on the same rounded weights:
flex may be at most twice as far from it as eager in half precision is, plus one machine epsilon.
A wrong term is O(1) away; the bounds only admit kernel rounding.

The half-precision cases run at the head dimensions of the real models (64: 162M, 128: 1.3B), in
bf16 and fp16: the dtype, head dimension and score modification decide the tile sizes the option
choice and its ladder settle on, which must compile and be right.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from kerple import positional
from kerple.model import GPTModel

from rounding import rounding_bound, score_rounding_spread

pytestmark = pytest.mark.gpu
VOCAB = 128
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _model(name: str, head_dim: int, heads: int, layers: int, window: int | None, length: int) -> GPTModel:
    torch.manual_seed(0)
    hidden = heads * head_dim
    pe = positional.build(name, num_heads=heads, head_dim=head_dim, hidden_size=hidden, max_positions=length,
                          num_layers=layers)
    return GPTModel(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, padded_vocab_size=VOCAB,
                    positional=pe, attention_window=window).cuda().train()


def _run(model: GPTModel, impl: str, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits (fp32) and every parameter's gradient (fp32) of one forward and backward with ``impl``."""
    model.set_attention(impl)
    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
    return logits.detach().float(), {key: p.grad.float() for key, p in model.named_parameters()}


def _tokens(length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length + 1), device="cuda", generator=torch.Generator("cuda").manual_seed(0))


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("name", positional.names())
def test_flex_gradients_match_eager_on_cuda(name: str) -> None:
    model, tokens = _model(name, head_dim=16, heads=4, layers=2, window=40, length=256), _tokens(256)
    eager_logits, eager_grads = _run(model, "eager", tokens)
    flex_logits, flex_grads = _run(model, "flex", tokens)
    torch.testing.assert_close(flex_logits, eager_logits, rtol=1e-4, atol=1e-4)
    for key, grad in eager_grads.items():
        torch.testing.assert_close(flex_grads[key], grad, rtol=1e-3, atol=1e-5, msg=key)


def _check_half(model: GPTModel, dtype: torch.dtype, tokens: torch.Tensor) -> None:
    """Flex in ``dtype`` against eager in ``dtype``, both measured from eager fp32 on the rounded weights."""
    half = model.to(dtype)
    reference_logits, reference_grads = _run(copy.deepcopy(half).float(), "eager", tokens)
    eager_logits, eager_grads = _run(half, "eager", tokens)
    flex_logits, flex_grads = _run(half, "flex", tokens)
    epsilon, options = torch.finfo(dtype).eps, half._flex.options_used()
    assert options, "the compiled CUDA kernel records the options it ran with"
    bound = 2 * _relative_error(eager_logits, reference_logits) + epsilon
    assert _relative_error(flex_logits, reference_logits) <= bound, options
    positional = {f"positional.{key}" for key, _ in half.positional.named_parameters()}
    spread = (score_rounding_spread(copy.deepcopy(half).float(), lambda fp32: _run(fp32, "eager", tokens), dtype)
              if positional else {})
    for key, reference in reference_grads.items():
        assert torch.isfinite(flex_grads[key]).all(), key
        if key in positional:  # the learnable terms got a gradient through flex, within rounding of eager's
            assert flex_grads[key].abs().sum() > 0, key
            error = (flex_grads[key] - eager_grads[key]).norm().item()
            assert error <= rounding_bound(spread[key]), (key, error, rounding_bound(spread[key]), options)
            continue
        bound = 2 * _relative_error(eager_grads[key], reference) + epsilon
        assert _relative_error(flex_grads[key], reference) <= bound, (key, options)


@pytest.mark.parametrize("name", positional.names())
def test_flex_matches_eager_in_bf16_with_a_window(name: str) -> None:
    _check_half(_model(name, head_dim=16, heads=4, layers=2, window=40, length=256), torch.bfloat16, _tokens(256))


@pytest.mark.parametrize("precision", sorted(HALF))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", positional.names())
def test_flex_forward_and_backward_at_real_head_dims(name: str, head_dim: int, precision: str) -> None:
    _check_half(_model(name, head_dim=head_dim, heads=2, layers=1, window=None, length=256), HALF[precision],
                _tokens(256))
