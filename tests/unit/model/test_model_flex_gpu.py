"""FlexAttention training on CUDA: logits and gradients (incl. learnable positional parameters) match eager.

Every registry entry, with an attention window, in fp32 (tight tolerance) and under bf16 autocast
(bf16 tolerance, compared as relative norm error so that single rounding flips do not decide).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kerple import positional
from kerple.model import GPTModel

pytestmark = pytest.mark.gpu
BF16_RELATIVE_ERROR = 2e-2  # a few bf16 ulps (2^-8 = 3.9e-3) accumulated over two layers


def _model(name: str, impl: str) -> GPTModel:
    torch.manual_seed(0)
    pe = positional.build(name, num_heads=4, head_dim=16, hidden_size=64, max_positions=512)
    return GPTModel(
        num_layers=2, hidden_size=64, num_attention_heads=4, padded_vocab_size=128, positional=pe,
        attention_impl=impl, attention_window=40,
    ).cuda()


def _run(name: str, impl: str, bf16: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    tokens = torch.randint(0, 128, (2, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    model = _model(name, impl).train()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
    return logits.detach().float(), {key: p.grad for key, p in model.named_parameters()}


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("name", positional.names())
def test_flex_gradients_match_eager_on_cuda(name: str) -> None:
    eager_logits, eager_grads = _run(name, "eager", bf16=False)
    flex_logits, flex_grads = _run(name, "flex", bf16=False)
    torch.testing.assert_close(flex_logits, eager_logits, rtol=1e-4, atol=1e-4)
    for key, grad in eager_grads.items():
        torch.testing.assert_close(flex_grads[key], grad, rtol=1e-3, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", positional.names())
def test_flex_matches_eager_in_bf16_on_cuda(name: str) -> None:
    eager_logits, eager_grads = _run(name, "eager", bf16=True)
    flex_logits, flex_grads = _run(name, "flex", bf16=True)
    assert _relative_error(flex_logits, eager_logits) < BF16_RELATIVE_ERROR
    for key, grad in eager_grads.items():
        assert flex_grads[key] is not None, key
        assert _relative_error(flex_grads[key], grad) < BF16_RELATIVE_ERROR, key
    model = _model(name, "eager")
    owned = {id(param) for param in model.positional.parameters()}
    for key, param in model.named_parameters():  # positional parameters got a gradient through flex
        if id(param) in owned:
            assert flex_grads[key].abs().sum() > 0, key
