"""Per-head Jacobian tables (:mod:`kerple.positional.jacobian`) over every registry entry.

Which embeddings have them (every learnable term of the distance alone; not FIRE, CABLE or the
parameter-free ones), their values against derivatives written out by hand (KERPLE-log, paper §4;
T5's bucket indicator), and, for every entry that has them, the gradient they give against autograd
of the embedding's own tables.
"""

from __future__ import annotations

import math

import pytest
import torch

import kerple.positional as positional
from kerple.positional.jacobian import distance_jacobian, stacked_parameters
from kerple.positional.t5 import t5_causal_bucket

H, LENGTH = 3, 150
SIZES = dict(num_heads=H, head_dim=16, hidden_size=48, max_positions=LENGTH)
DISTANCE_BASED = {
    "kerple_log", "kerple_power", "kerple_log3", "kerple_bias_wht", "kerple_wht",
    "gauss_wht1", "gauss_wht2", "gauss_bias2", "gauss_bias3", "rpe",
}
CPU = torch.device("cpu")


def build(name: str) -> positional.PositionalEmbedding:
    torch.manual_seed(0)
    return positional.build(name, **SIZES)


def test_which_embeddings_have_jacobian_tables() -> None:
    have = {name for name in positional.names() if distance_jacobian(build(name), 8, CPU) is not None}
    assert have == DISTANCE_BASED


def test_frozen_parameters_have_none() -> None:
    module = build("kerple_log").requires_grad_(False)
    assert distance_jacobian(module, 8, CPU) is None


def test_kerple_log_jacobian_is_the_derivative_of_the_formula() -> None:
    """``b = -r1·log(1 + r2·d)``: ``∂b/∂r1 = -log(1 + r2·d)``, ``∂b/∂r2 = -r1·d / (1 + r2·d)`` (r1, r2
    inside their clamps, where the straight-through clamp is the identity)."""
    module = build("kerple_log")
    with torch.no_grad():
        module.bias_p.copy_(torch.tensor([0.5, 1.0, 1.7]).view(H, 1, 1))
        module.bias_a.copy_(torch.tensor([0.2, 0.05, 0.9]).view(H, 1, 1))
    jacobian = distance_jacobian(module, LENGTH, CPU)
    r1, r2 = module.bias_p.detach().view(H, 1).double(), module.bias_a.detach().view(H, 1).double()
    d = torch.arange(LENGTH, dtype=torch.float64)[None, :]
    expected = torch.stack([-torch.log1p(r2 * d), -r1 * d / (1 + r2 * d)])  # [P = 2, H, L]
    torch.testing.assert_close(jacobian.tables.bias_jacobian.double(), expected, rtol=1e-6, atol=1e-6)
    assert jacobian.tables.scale is None and jacobian.tables.scale_jacobian is None
    assert torch.equal(jacobian.theta.detach(), torch.cat([r1.T, r2.T]).float())


def test_t5_jacobian_is_the_bucket_indicator() -> None:
    """``b[h, d] = weight[bucket(d), h]·√head_dim``: the derivative in ``weight[k, h]`` is ``√head_dim`` where
    ``bucket(d) = k``; each bucket's support runs from its first to its last distance."""
    jacobian = distance_jacobian(build("rpe"), LENGTH, CPU)
    buckets = t5_causal_bucket(torch.arange(LENGTH))
    indicator = (buckets[None, :] == torch.arange(32)[:, None]).float() * math.sqrt(16)  # [32, L]
    torch.testing.assert_close(jacobian.tables.bias_jacobian, indicator[:, None, :].expand(32, H, LENGTH))
    for bucket in (0, 15, 16, 31):
        distances = torch.nonzero(buckets == bucket).flatten()
        assert jacobian.tables.support[bucket].tolist() == [distances.min().item(), distances.max().item()]
    assert jacobian.tables.support[20].tolist()[0] > 0


@pytest.mark.parametrize("temperature", [1.0, 1.6])
@pytest.mark.parametrize("name", sorted(DISTANCE_BASED))
def test_jacobian_gives_the_tables_gradient(name: str, temperature: float) -> None:
    """For weights ``w``, ``Σ_d w[h, d]·J[k, h, d]`` carried back through ``theta`` equals autograd of
    ``Σ w·(bias/τ) + Σ w'·scale`` into the parameters; the values are the tables'."""
    module = build(name)
    jacobian = distance_jacobian(module, LENGTH, CPU, temperature)
    bias, scale = module.distance_tables(LENGTH)
    weights = torch.randn(2, H, LENGTH, generator=torch.Generator().manual_seed(3))
    parameters = list(module.parameters())
    loss = sum((table * w).sum() for table, w in zip((None if bias is None else bias / temperature, scale), weights)
               if table is not None)
    expected = torch.autograd.grad(loss, parameters)
    tables = jacobian.tables
    contracted = sum((j * w).sum(-1) for j, w in zip((tables.bias_jacobian, tables.scale_jacobian), weights)
                     if j is not None)
    got = torch.autograd.grad(jacobian.theta, parameters, contracted)
    for parameter_name, g, e in zip(dict(module.named_parameters()), got, expected):
        error = ((g - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()
        assert error < 1e-5, f"{name}.{parameter_name}: {error:.2e}"
    if bias is not None:
        torch.testing.assert_close(tables.bias, bias.detach() / temperature)
    if scale is not None:
        torch.testing.assert_close(tables.scale, scale.detach())


def test_stacked_parameters_put_heads_last() -> None:
    """``theta[:, h]`` holds head ``h``'s values of every parameter, in declaration order."""
    module = build("rpe")
    assert torch.equal(stacked_parameters(module), module.weight)  # [buckets, H] already
    module = build("kerple_bias_wht")
    theta = stacked_parameters(module)
    names = list(module.head_parameters())
    for slot, name in enumerate(names):
        assert torch.equal(theta[slot], getattr(module, name).detach().view(H))
