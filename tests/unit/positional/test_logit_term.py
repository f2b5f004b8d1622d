"""Contract of the logit terms fused kernels evaluate per score, over every registry entry.

A closed form must equal the distance tables (the path eager and sdpa use) on every causal score,
in value and in the gradient it sends to the parameters, stay finite where the kernel masks it,
read only per-head tensors, and index each of them once (FlexAttention's rule for captured tensors
that need a gradient). Embeddings without one are gathered from their tables in the compute dtype.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import kerple.positional as positional
from kerple.positional.base import gather_by_distance
from kerple.positional.logit_term import LogitTerm, ScorePosition, distance_table_term

H = 4
SIZES = dict(num_heads=H, head_dim=8, hidden_size=32, max_positions=64)
CLOSED_FORMS = {
    "alibi", "kerple_log", "kerple_power", "kerple_log3", "kerple_bias_wht", "kerple_wht", "kerple_power_original",
    "gauss_wht1", "gauss_wht2", "gauss_bias2", "gauss_bias3", "sandwich_smoothed",
}
TABLE_ONLY = {"rpe", "sandwich"}
WITHOUT_TABLES = {"fire"}  # a closed form of the query position too: no distance tables
LAYER_TERMS = {"cable"}  # a term of each layer's input (layer_logit_term)


def build(name: str) -> positional.PositionalEmbedding:
    torch.manual_seed(0)
    return positional.build(name, **SIZES)


def grid(q_len: int, k_len: int) -> ScorePosition:
    """Every score of ``[H, q_len, k_len]`` as broadcastable indices; query row ``i`` sits at ``k - q + i``."""
    return ScorePosition(
        batch=torch.zeros((), dtype=torch.long),
        head=torch.arange(H)[:, None, None],
        query=torch.arange(k_len - q_len, k_len)[None, :, None],
        key=torch.arange(k_len)[None, None, :],
    )


def table_logits(module: positional.PositionalEmbedding, score: torch.Tensor) -> torch.Tensor:
    """``score * scale + bias`` from the gathered distance tables (the eager path's reference)."""
    q_len, k_len = score.shape[-2:]
    bias, scale = module.distance_tables(k_len)
    if scale is not None:
        score = score * gather_by_distance(scale, q_len, k_len)
    if bias is not None:
        score = score + gather_by_distance(bias, q_len, k_len)
    return score


def causal(q_len: int, k_len: int) -> torch.Tensor:
    return torch.arange(k_len)[None, :] <= torch.arange(k_len - q_len, k_len)[:, None]  # [q, k]


def test_which_embeddings_have_a_closed_form() -> None:
    with_term = {name for name in positional.names() if build(name).logit_term() is not None}
    assert with_term == CLOSED_FORMS | WITHOUT_TABLES
    with_tables = {name for name in positional.names() if any(t is not None for t in build(name).distance_tables(4))}
    assert with_tables == CLOSED_FORMS | TABLE_ONLY
    hidden = torch.randn(1, 3, SIZES["hidden_size"])
    per_layer = {name for name in positional.names() if build(name).layer_logit_term(0, hidden) is not None}
    assert per_layer == LAYER_TERMS
    logit_kinds = {name for name in positional.names() if build(name).kind.value in ("bias", "weight")}
    assert logit_kinds == CLOSED_FORMS | TABLE_ONLY | WITHOUT_TABLES | LAYER_TERMS


def _gradients(module: positional.PositionalEmbedding, logits: torch.Tensor, weights: torch.Tensor) -> dict:
    module.zero_grad()
    (logits * weights).sum().backward()
    return {name: param.grad.clone() for name, param in module.named_parameters()}


@pytest.mark.parametrize("q_len,k_len", [(37, 37), (5, 37)])
@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_closed_form_equals_the_tables_in_value_and_gradient(name: str, q_len: int, k_len: int) -> None:
    module = build(name)
    generator = torch.Generator().manual_seed(3)
    score = torch.randn(H, q_len, k_len, generator=generator)
    # the kernel masks non-causal scores after the term: their weight is 0, their gradient must stay finite
    weights = torch.randn(H, q_len, k_len, generator=generator) * causal(q_len, k_len)
    closed = module.logit_term().apply(score, grid(q_len, k_len))
    reference = table_logits(module, score)
    mask = causal(q_len, k_len)
    assert torch.isfinite(closed).all()
    torch.testing.assert_close(closed[:, mask], reference[:, mask], rtol=1e-6, atol=1e-6)
    if not module.learnable:
        return
    closed_grads = _gradients(module, closed, weights)
    table_grads = _gradients(module, reference, weights)
    assert closed_grads.keys() == table_grads.keys()
    for key, grad in table_grads.items():
        assert torch.isfinite(closed_grads[key]).all(), key
        torch.testing.assert_close(closed_grads[key], grad, rtol=1e-5, atol=1e-6, msg=key)


class _IndexCounter(TorchFunctionMode):
    """Counts ``tensor[...]`` reads of the watched tensors."""

    def __init__(self, watched: tuple[torch.Tensor, ...]) -> None:
        super().__init__()
        self.counts = {id(tensor): 0 for tensor in watched}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.Tensor.__getitem__ and id(args[0]) in self.counts:
            self.counts[id(args[0])] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS | WITHOUT_TABLES))
def test_closed_form_reads_each_per_head_tensor_once(name: str) -> None:
    module = build(name)
    term = module.logit_term().divide_bias(1.7)
    per_head = [tensor for tensor in term.tensors if tensor.dim() >= 1]
    for tensor in per_head:  # per head, or one value (FIRE's MLP input layer)
        assert tensor.shape in ((H,), (1,)), tensor.shape
    assert all(tensor.dim() == 0 for tensor in term.tensors if tensor.dim() < 1)  # the 1/τ factor
    assert term.kind == "closed_form" and term.gathered_bytes == 0  # nothing gathered into a score-shaped tile
    position = ScorePosition(*(torch.tensor(value) for value in (0, 2, 9, 4)))  # one score, as inside the kernel
    with _IndexCounter(term.tensors) as counter:
        term.apply(torch.tensor(0.5), position)
    assert [counter.counts[id(tensor)] for tensor in per_head] == [1] * len(per_head)
    if positional.family(name).learnable:  # all but the buffers (FIRE's init_L) carry a parameter's gradient
        assert sum(not tensor.requires_grad for tensor in per_head) == len(list(module.buffers()))


@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht", "alibi"])
def test_divide_bias_divides_only_the_bias(name: str) -> None:
    module = build(name)
    score = torch.randn(H, 9, 9)
    term = module.logit_term()
    bias, scale = module.distance_tables(9)
    expected = score * (1.0 if scale is None else gather_by_distance(scale, 9, 9)) + gather_by_distance(bias, 9, 9) / 2.5
    mask = causal(9, 9)
    torch.testing.assert_close(term.divide_bias(2.5).apply(score, grid(9, 9))[:, mask], expected[:, mask])
    assert term.divide_bias(1.0) is term


@pytest.mark.parametrize("name", sorted(TABLE_ONLY) + ["kerple_bias_wht"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_distance_table_term_gathers_the_tables_in_the_compute_dtype(name: str, dtype: torch.dtype) -> None:
    module = build(name)
    bias, scale = module.distance_tables(20)
    term = distance_table_term(bias, scale, dtype)
    assert term.kind == "distance_table" and all(tensor.dtype == dtype for tensor in term.tensors)
    assert term.gathered_bytes == len(term.tensors) * torch.empty((), dtype=dtype).element_size()
    score = torch.randn(H, 20, 20).to(dtype)
    expected = score
    if scale is not None:
        expected = expected * gather_by_distance(scale.to(dtype), 20, 20)
    if bias is not None:
        expected = expected + gather_by_distance(bias.to(dtype), 20, 20)
    mask = causal(20, 20)
    assert torch.equal(term.apply(score, grid(20, 20))[:, mask], expected[:, mask])


def test_no_tables_no_term() -> None:
    assert distance_table_term(None, None, torch.float32) is None
    assert isinstance(build("kerple_log").logit_term(), LogitTerm)
