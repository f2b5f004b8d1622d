"""The reference the positional-gradient reduction is tested against: dense float64 attention with the
embedding's distance tables, differentiated by autograd (no tile, no diagonal sums, no log-sum-exp trick)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kerple import positional
from kerple.positional.base import PositionalEmbedding


@dataclass
class Case:
    """Random attention inputs, the eager float64 output, log-sum-exp, and the gradients of the tables and of
    the parameters."""

    embedding: PositionalEmbedding
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    grad_output: torch.Tensor
    output: torch.Tensor  # float64 [b, H, L, d]
    lse: torch.Tensor  # float64 [b, H, L]
    gradients: dict[str, torch.Tensor]  # d(Σ output · grad_output) / d parameter, float64
    table_gradients: dict[str, torch.Tensor]  # the same loss's gradient by "bias"/"scale" table [H, L], float64


def build(name: str, heads: int, head_dim: int, length: int) -> PositionalEmbedding:
    torch.manual_seed(0)
    return positional.build(name, num_heads=heads, head_dim=head_dim, hidden_size=heads * head_dim,
                            max_positions=length)


def eager_case(name: str, shape: tuple[int, int, int, int], dtype: torch.dtype = torch.float32,
               window: int | None = None, seed: int = 1) -> Case:
    """Inputs of ``shape = (b, H, L, d)`` in ``dtype`` and the float64 reference on those (rounded) values."""
    batch, heads, length, dim = shape
    embedding = build(name, heads, dim, length)
    generator = torch.Generator().manual_seed(seed)
    query, key, value, grad_output = (torch.randn(shape, generator=generator).to(dtype) for _ in range(4))
    parameters = dict(embedding.named_parameters())
    bias, scale = embedding.distance_tables(length)
    tables = {name: table for name, table in (("bias", bias), ("scale", scale)) if table is not None}
    position = torch.arange(length)
    distance = position[:, None] - position[None, :]
    index = distance.clamp(0, length - 1)
    logits = query.double() @ key.double().transpose(-1, -2) * dim**-0.5  # [b, H, L, L]
    scores = logits if scale is None else logits * scale.double()[:, index]
    if bias is not None:
        scores = scores + bias.double()[:, index]
    visible = distance >= 0 if window is None else (distance >= 0) & (distance < window)
    scores = scores.masked_fill(~visible, float("-inf"))
    output = torch.softmax(scores, -1) @ value.double()
    grads = torch.autograd.grad((output * grad_output.double()).sum(), [*parameters.values(), *tables.values()])
    return Case(embedding, query, key, value, grad_output, output.detach(), torch.logsumexp(scores, -1).detach(),
                dict(zip(parameters, grads)), dict(zip(tables, grads[len(parameters):])))


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |got - expected| / max |expected|``."""
    return ((got.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-300)).item()


def tables(case: Case) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The embedding's ``(bias, scale)`` float32 ``[H, L]`` tables, differentiable, at the case's length."""
    return case.embedding.distance_tables(case.query.shape[-2])


def gradient_errors(case: Case, bias: torch.Tensor | None, scale: torch.Tensor | None,
                    grad_bias: torch.Tensor | None, grad_scale: torch.Tensor | None) -> dict[str, float]:
    """Relative errors of the tables' gradients ``grad_bias``/``grad_scale`` ``[H, L]`` against the reference,
    and of each parameter's gradient when autograd carries them back through ``bias``/``scale``."""
    pairs = [(name, table, grad) for name, table, grad in (("bias", bias, grad_bias), ("scale", scale, grad_scale))
             if table is not None]
    assert [name for name, *_ in pairs] == list(case.table_gradients)
    errors = {f"table {name}": relative_error(grad, case.table_gradients[name]) for name, _, grad in pairs}
    parameters = dict(case.embedding.named_parameters())
    got = torch.autograd.grad([table for _, table, _ in pairs], list(parameters.values()),
                              [grad.to(table.dtype) for _, table, grad in pairs], retain_graph=True)
    return {**errors, **{name: relative_error(g, case.gradients[name]) for name, g in zip(parameters, got)}}
