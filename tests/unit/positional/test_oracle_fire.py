"""FIRE (Li et al. 2023, arXiv 2310.04418): the closed form against the paper's formula restated densely, and one
score computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

import kerple.positional as positional
from dense_views import grid
from kerple.positional.base import ModelShape
from kerple.positional.fire import Fire
from kerple.positional.logit_term import ScorePosition

H = 3


def build(**options) -> Fire:
    options.setdefault("fire_init_threshold", 8.0)
    torch.manual_seed(0)
    return positional.build("fire", num_heads=H, head_dim=4, hidden_size=12, max_positions=64, **options)


def score_at(head: int, query: int, key: int) -> ScorePosition:
    """One score, as FlexAttention hands it to ``score_mod`` (0-d indices)."""
    return ScorePosition(*(torch.tensor(value) for value in (0, head, query, key)))


def reference_bias(module: Fire, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``MLP(ψ(i - j) / ψ(max(i, L)))`` as ``[H, q, k]``, ψ(x) = log(|c·x| + 1), written with the MLP as
    a batched matrix product (the module unrolls it per hidden unit)."""
    c = module.c.abs()
    threshold = (module.L_multiplier * module.init_L).abs()
    distance = (queries[:, None] - keys[None, :]).clamp(min=0).float()  # [q, k]
    position = torch.maximum(queries.float(), threshold)[:, None]  # [q, 1]
    x = torch.log(c * distance + 1) / (torch.log(c * position + 1) + 1e-6)  # [q, k]
    hidden = torch.relu(x[..., None] * module.mlp[0].weight[:, 0] + module.mlp[0].bias)  # [q, k, W]
    return (hidden @ module.mlp[2].weight.T).permute(2, 0, 1)  # [H, q, k]


def test_one_score_by_hand() -> None:
    module = build(fire_mlp_width=2, fire_init_c=0.5, fire_init_threshold=4.0)
    with torch.no_grad():
        module.mlp[0].weight.copy_(torch.tensor([[2.0], [-1.0]]))
        module.mlp[0].bias.copy_(torch.tensor([0.1, 0.3]))
        module.mlp[2].weight.copy_(torch.tensor([[1.0, 1.0], [0.5, -2.0], [0.0, 3.0]]))
        module.L_multiplier.fill_(1.5)  # threshold 6
    # query 9 > L = 6: x = log(1 + 0.5·5) / log(1 + 0.5·9)
    x = math.log(3.5) / (math.log(5.5) + 1e-6)
    units = [max(0.0, 2.0 * x + 0.1), max(0.0, -x + 0.3)]
    expected = [units[0] + units[1], 0.5 * units[0] - 2.0 * units[1], 3.0 * units[1]]
    term = module.logit_term()
    for head in range(H):
        score = score_at(head, 9, 4)
        assert term.bias(term.tensors, score).item() == pytest.approx(expected[head], rel=1e-6)
    # query 3 < L: normalised by ψ(L) = log(1 + 0.5·6)
    x = math.log(2.0) / (math.log(4.0) + 1e-6)
    units = [max(0.0, 2.0 * x + 0.1), max(0.0, -x + 0.3)]
    assert term.bias(term.tensors, score_at(0, 3, 1)).item() == pytest.approx(sum(units), rel=1e-6)


@pytest.mark.parametrize("first_query", [0, 3, 40])  # rows below and above the threshold L = 1.2 · 8
def test_closed_form_equals_the_dense_formula_in_value_and_gradient(first_query: int) -> None:
    module = build()
    assert module.init_L.item() == 8.0
    assert Fire(ModelShape(num_heads=H, head_dim=4, hidden_size=12, max_positions=64)).init_L.item() == 512.0  # the default
    with torch.no_grad():
        module.c.fill_(0.3)
        module.L_multiplier.fill_(1.2)
    q_len, k_len = 6, first_query + 6
    queries, keys = torch.arange(first_query, k_len), torch.arange(k_len)
    causal = keys[None, :] <= queries[:, None]
    weights = torch.randn(H, q_len, k_len, generator=torch.Generator().manual_seed(1)) * causal
    results = []
    for evaluate in (lambda: reference_bias(module, queries, keys),
                     lambda: module.logit_term().bias(module.logit_term().tensors, grid(H, q_len, k_len))):
        module.zero_grad()
        values = evaluate()
        (values * weights).sum().backward()
        results.append((values.detach(), {name: p.grad.clone() for name, p in module.named_parameters()}))
    (reference, reference_grads), (closed, closed_grads) = results
    torch.testing.assert_close(closed[:, causal], reference[:, causal], rtol=1e-5, atol=1e-6)
    assert torch.isfinite(closed).all()
    for name, grad in reference_grads.items():
        if name != "L_multiplier" or first_query < 9.6:  # the threshold only acts on rows below it
            assert grad.abs().sum() > 0, name
        torch.testing.assert_close(closed_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_term_depends_on_the_query_position_beyond_the_threshold() -> None:
    """Not a function of the distance alone: the same distance reads differently at a later query."""
    module = build()
    term = module.logit_term()
    early, late = (term.bias(term.tensors, score_at(1, query, query - 3)) for query in (5, 40))
    assert not torch.allclose(early, late)
    below = [term.bias(term.tensors, score_at(1, query, query - 3)) for query in (4, 7)]  # both below L = 8
    torch.testing.assert_close(below[0], below[1])
