"""Oracles for the KERPLE kernels (paper §4, §5.3) and the Gaussian-like kernels (Appendix A.3).

Each formula is restated with ``math`` over chosen per-head parameter values, then compared with
``new_scores = scores * logit_scale + bias`` built from the module.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from dense_views import dense_bias, dense_scale
import kerple.positional as positional

HEADS = 3
Q_LEN, K_LEN = 4, 11

# Chosen parameter values per head (inside the clamp ranges so the oracle needs no clamping).
VALUES = {
    "bias_p": [0.5, 1.0, 1.7],
    "bias_a": [0.05, 0.3, 0.9],
    "bias_pow": [0.4, 1.0, 2.0],
    "bias_scale": [0.2, 1.0, 1.9],
    "wei_p": [0.3, 1.2, 2.0],
    "wei_a": [0.01, 0.25, 0.8],
}


def log_bias(v: dict[str, float], d: int) -> tuple[float, float]:
    return -v["bias_p"] * math.log(1 + v["bias_a"] * d), 1.0


def power_bias(v: dict[str, float], d: int) -> tuple[float, float]:
    return -v["bias_a"] * d ** v["bias_p"], 1.0


def log3_bias(v: dict[str, float], d: int) -> tuple[float, float]:
    return -v["bias_p"] * math.log(1 + v["bias_a"] * d ** v["bias_pow"]), 1.0


def bias_weight(v: dict[str, float], d: int) -> tuple[float, float]:
    return -v["bias_a"] * d ** v["bias_p"], math.exp(-v["wei_a"] * d ** v["wei_p"])


def weight_only(v: dict[str, float], d: int) -> tuple[float, float]:
    return 0.0, math.exp(-v["wei_a"] * d ** v["wei_p"])


def gauss_weight1(v: dict[str, float], d: int) -> tuple[float, float]:
    return 0.0, math.exp(-v["wei_a"] * d**2)


def gauss_bias2(v: dict[str, float], d: int) -> tuple[float, float]:
    return v["bias_scale"] * math.exp(-v["bias_a"] * d**2), 1.0


def gauss_bias3(v: dict[str, float], d: int) -> tuple[float, float]:
    return v["bias_scale"] * math.exp(-v["bias_a"] * d ** v["bias_p"]), 1.0


# name -> (oracle returning (bias, weight) at distance d, parameter names)
ORACLES: dict[str, tuple[Callable[[dict[str, float], int], tuple[float, float]], set[str]]] = {
    "kerple_log": (log_bias, {"bias_p", "bias_a"}),
    "kerple_power": (power_bias, {"bias_p", "bias_a"}),
    "kerple_power_ap_": (power_bias, {"bias_p", "bias_a"}),
    "kerple_log3": (log3_bias, {"bias_p", "bias_a", "bias_pow"}),
    "kerple_bias_wht": (bias_weight, {"bias_p", "bias_a", "wei_p", "wei_a"}),
    "kerple_wht": (weight_only, {"wei_p", "wei_a"}),
    "gauss_wht1": (gauss_weight1, {"wei_a"}),
    "gauss_wht2": (weight_only, {"wei_p", "wei_a"}),
    "gauss_bias2": (gauss_bias2, {"bias_scale", "bias_a"}),
    "gauss_bias3": (gauss_bias3, {"bias_scale", "bias_a", "bias_p"}),
}


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_kernel_matches_formula(name: str) -> None:
    oracle, param_names = ORACLES[name]
    module = positional.build(name, num_heads=HEADS, head_dim=8, hidden_size=24, max_positions=16)
    assert {n for n, _ in module.named_parameters()} == param_names
    with torch.no_grad():
        for param_name in param_names:
            getattr(module, param_name).copy_(torch.tensor(VALUES[param_name]).view(HEADS, 1, 1))
    torch.manual_seed(0)
    scores = torch.randn(HEADS, Q_LEN, K_LEN)
    bias, scale = dense_bias(module, Q_LEN, K_LEN), dense_scale(module, Q_LEN, K_LEN)
    new_scores = scores * (1.0 if scale is None else scale) + (0.0 if bias is None else bias)
    for h in range(HEADS):
        values = {param_name: VALUES[param_name][h] for param_name in param_names}
        for row in range(Q_LEN):
            i = K_LEN - Q_LEN + row
            for j in range(i + 1):
                bias_value, weight_value = oracle(values, i - j)
                expected = scores[h, row, j].item() * weight_value + bias_value
                assert new_scores[h, row, j].item() == pytest.approx(expected, rel=1e-5, abs=1e-6), (h, i, j)


def test_log3_with_unit_exponent_equals_log() -> None:
    torch.manual_seed(0)
    log3 = positional.build("kerple_log3", num_heads=HEADS, head_dim=8, hidden_size=24, max_positions=16)
    log = positional.build("kerple_log", num_heads=HEADS, head_dim=8, hidden_size=24, max_positions=16)
    with torch.no_grad():
        log.bias_p.copy_(log3.bias_p)
        log.bias_a.copy_(log3.bias_a)
        log3.bias_pow.fill_(1.0)
    assert torch.allclose(dense_bias(log3, 9, 9), dense_bias(log, 9, 9))


def test_clamped_values_used_in_forward() -> None:
    """Out-of-range values act as their clamp: a -> 0.01, p -> [0.01, 2], log r1 -> 0.01."""
    module = positional.build("kerple_bias_wht", num_heads=1, head_dim=8, hidden_size=8, max_positions=16)
    with torch.no_grad():
        module.bias_a.fill_(-5.0)
        module.bias_p.fill_(7.0)
        module.wei_a.fill_(0.0)
        module.wei_p.fill_(-1.0)
    bias, scale = module.distance_tables(6)
    for d in range(6):
        assert bias[0, d].item() == pytest.approx(-0.01 * d**2.0, rel=1e-6)
        assert scale[0, d].item() == pytest.approx(math.exp(-0.01 * d**0.01) if d else 1.0, rel=1e-6)
    log = positional.build("kerple_log", num_heads=1, head_dim=8, hidden_size=8, max_positions=16)
    with torch.no_grad():
        log.bias_p.fill_(-2.0)
        log.bias_a.fill_(50.0)  # no upper clamp on a
    table, _ = log.distance_tables(4)
    assert table[0].tolist() == pytest.approx([-0.01 * math.log(1 + 50.0 * d) for d in range(4)], rel=1e-6)


def test_reference_inits() -> None:
    """U(0, 2) for exponents/outer coefficients, U(0, 1) for a (docs/reference-format.md §2)."""
    torch.manual_seed(0)
    module = positional.build("kerple_bias_wht", num_heads=4000, head_dim=8, hidden_size=8, max_positions=16)
    for name, high in (("bias_p", 2.0), ("bias_a", 1.0), ("wei_p", 2.0), ("wei_a", 1.0)):
        values = getattr(module, name).flatten()
        assert 0.0 <= values.min().item() and values.max().item() <= high
        assert values.mean().item() == pytest.approx(high / 2, rel=0.05)
    log = positional.build("kerple_log", num_heads=4000, head_dim=8, hidden_size=8, max_positions=16)
    assert log.bias_p.mean().item() == pytest.approx(1.0, rel=0.05)
    assert log.bias_a.mean().item() == pytest.approx(0.5, rel=0.05)


def test_power_gradient_in_exponent() -> None:
    """d/dp of -a*d^p is -a*d^p*log(d), and exactly 0 at d = 0."""
    module = positional.build("kerple_power", num_heads=1, head_dim=8, hidden_size=8, max_positions=16)
    a, p = 0.3, 1.4
    with torch.no_grad():
        module.bias_a.fill_(a)
        module.bias_p.fill_(p)
    for d in range(4):
        module.zero_grad()
        table, _ = module.distance_tables(4)
        table[0, d].backward()
        expected = -a * d**p * math.log(d) if d else 0.0
        assert module.bias_p.grad.item() == pytest.approx(expected, rel=1e-5, abs=1e-12)


def test_metrics_report_effective_values() -> None:
    module = positional.build("kerple_log", num_heads=2, head_dim=8, hidden_size=8, max_positions=16)
    with torch.no_grad():
        module.bias_p.copy_(torch.tensor([-1.0, 0.5]).view(2, 1, 1))
        module.bias_a.copy_(torch.tensor([0.2, 0.4]).view(2, 1, 1))
    stats = module.metrics()
    assert stats["bias_p/head0"] == pytest.approx(0.01)
    assert stats["bias_p/head1"] == pytest.approx(0.5)
    assert stats["bias_a/mean"] == pytest.approx(0.3)
    assert stats["bias_a/max"] == pytest.approx(0.4)
    assert stats["bias_p/min"] == pytest.approx(0.01)
