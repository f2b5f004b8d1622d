"""FlexAttention training on CUDA: logits and gradients (incl. learnable positional parameters) match eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kerple import positional
from kerple.model import GPTModel

pytestmark = pytest.mark.gpu


def _model(name: str, impl: str) -> GPTModel:
    torch.manual_seed(0)
    pe = positional.build(name, num_heads=4, head_dim=16, hidden_size=64, max_positions=512)
    return GPTModel(
        num_layers=2, hidden_size=64, num_attention_heads=4, padded_vocab_size=128, positional=pe,
        attention_impl=impl, attention_window=40,
    ).cuda()


@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht", "rpe", "alibi"])
def test_flex_gradients_match_eager_on_cuda(name: str) -> None:
    tokens = torch.randint(0, 128, (2, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    results = {}
    for impl in ("eager", "flex"):
        model = _model(name, impl).train()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        results[impl] = (logits.detach(), {key: p.grad for key, p in model.named_parameters()})
    torch.testing.assert_close(results["flex"][0], results["eager"][0], rtol=1e-4, atol=1e-4)
    for key, grad in results["eager"][1].items():
        torch.testing.assert_close(results["flex"][1][key], grad, rtol=1e-3, atol=1e-5, msg=key)
