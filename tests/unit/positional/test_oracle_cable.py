"""CABLE (Veisi et al. 2025, arXiv 2503.08067): the per-layer term against the formula written out, by hand and
densely, in value and in gradient (to W, a and the layer's input)."""

from __future__ import annotations

import math

import pytest
import torch

import kerple.positional as positional
from dense_views import grid
from kerple.model import KVCache
from kerple.positional.cable import Cable

H, HIDDEN, LAYERS = 2, 6, 3


def build() -> Cable:
    torch.manual_seed(0)
    return positional.build("cable", num_heads=H, head_dim=3, hidden_size=HIDDEN, max_positions=32, num_layers=LAYERS)


def reference_bias(module: Cable, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    """``b[b, h, i, j] = s_i - s_j`` with ``s_t = Σ_{k<=t} -softplus(W x_k + a)``, the sums as a
    lower-triangular matrix product, ``[b, H, n, n]``."""
    logits = torch.einsum("bnd,hd->bhn", hidden, module.weight[layer]) + module.bias[layer][:, None]
    n = hidden.shape[1]
    lower = torch.tril(torch.ones(n, n))  # s = lower @ increments
    sums = torch.einsum("ik,bhk->bhi", lower, -torch.log1p(torch.exp(logits)))
    return sums[..., :, None] - sums[..., None, :]


def dense(module: Cable, layer: int, hidden: torch.Tensor) -> torch.Tensor:
    term = module.layer_logit_term(layer, hidden)
    batch, n = hidden.shape[:2]
    position = grid(H, n, n)._replace(batch=torch.arange(batch)[:, None, None, None])
    return term.bias(term.tensors, position)  # [b, H, n, n]


def test_by_hand() -> None:
    module = build()
    with torch.no_grad():
        module.weight.zero_()
        module.weight[1, 0, 0] = 1.0
        module.bias[1].copy_(torch.tensor([0.0, 2.0]))
    hidden = torch.zeros(1, 3, HIDDEN)
    hidden[0, :, 0] = torch.tensor([1.0, -1.0, 0.5])
    term = dense(module, 1, hidden)
    softplus = [math.log1p(math.exp(v)) for v in (1.0, -1.0, 0.5)]
    # head 0: b(2, 0) = s_2 - s_0 = -(softplus(x_1) + softplus(x_2)); head 1: W = 0, a = 2
    assert term[0, 0, 2, 0].item() == pytest.approx(-(softplus[1] + softplus[2]), rel=1e-6)
    assert term[0, 1, 2, 0].item() == pytest.approx(-2 * math.log1p(math.exp(2.0)), rel=1e-6)
    assert term[0, 0, 1, 1].item() == 0.0  # the diagonal
    assert (term[0][:, torch.tril(torch.ones(3, 3)).bool()] <= 0).all()  # never positive on causal scores


@pytest.mark.parametrize("layer", [0, 2])
def test_term_equals_the_formula_in_value_and_gradient(layer: int) -> None:
    module = build()
    hidden = torch.randn(2, 7, HIDDEN, requires_grad=True)
    causal = torch.tril(torch.ones(7, 7)).bool()
    weights = torch.randn(2, H, 7, 7) * causal
    results = []
    for evaluate in (reference_bias, dense):
        module.zero_grad()
        hidden.grad = None
        values = evaluate(module, layer, hidden)
        (values * weights).sum().backward()
        results.append((values.detach(), module.weight.grad.clone(), module.bias.grad.clone(), hidden.grad.clone()))
    for ours, expected in zip(results[1], results[0]):
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
    other_layers = [index for index in range(LAYERS) if index != layer]
    assert (module.weight.grad[other_layers] == 0).all() and module.weight.grad[layer].abs().sum() > 0


def test_cache_continues_the_running_sum() -> None:
    module = build()
    hidden = torch.randn(1, 9, HIDDEN)
    full = dense(module, 1, hidden)
    cache = KVCache(LAYERS)
    for start, stop in ((0, 4), (4, 5), (5, 9)):
        term = module.layer_logit_term(1, hidden[:, start:stop], cache)
        position = grid(H, stop - start, stop)
        torch.testing.assert_close(term.bias(term.tensors, position), full[0, :, start:stop, :stop])
        cache.advance(stop - start)
    assert cache.term_values(1).shape == (1, H, 9) and cache.term_values(0) is None
