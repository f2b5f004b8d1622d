"""Gaussian-like kernels of KERPLE Appendix A.3, as a weight or as a bias.

Bounded shift-invariant kernels ``exp(-a * d^p)`` (positive definite for ``0 < p <= 2``, Fact 5):

* ``gauss_wht1`` (1-para-wht):   logits * exp(-r1 * d^2)
* ``gauss_wht2`` (2-para-wht):   logits * exp(-r1 * d^r2),       0 < r2 <= 2
* ``gauss_bias2`` (2-para-bias): logits + r1 * exp(-r2 * d^2)
* ``gauss_bias3`` (3-para-bias): logits + r1 * exp(-r2 * d^r3),  0 < r3 <= 2

The reference has no such classes. Parameter names follow the NeoX power family (``a`` multiplies
``d^p``, ``p`` is the exponent, ``wei_``/``bias_`` for the term): weights use ``wei_a`` (r1) and
``wei_p`` (r2); biases use ``bias_scale`` for the new amplitude r1, ``bias_a`` (r2) and
``bias_p`` (r3). Inits: ``a`` U(0, 1), ``p`` U(0, 2) as KERPLE; the amplitude U(0, 2) like the
log variant's outer coefficient. Clamps: amplitudes and ``a`` ``>= 0.01``, ``p`` in ``[0.01, 2]``,
straight-through as in :mod:`kerple.positional.kerple`.
"""

from __future__ import annotations

import torch

from kerple.positional.base import PositionKind
from kerple.positional.functional import distance_power
from kerple.positional.kerple import MAX_EXPONENT, MIN_VALUE, LearnableKernel, power_weight

_COEFFICIENT = (1.0, MIN_VALUE, None)
_POWER = (2.0, MIN_VALUE, MAX_EXPONENT)
_AMPLITUDE = (2.0, MIN_VALUE, None)


def squared_weight(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """1-para-wht: ``exp(-r1 * d^2)``, r1 = ``wei_a``."""
    return torch.exp(-params["wei_a"] * distance.square())


def squared_bias(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """2-para-bias: ``r1 * exp(-r2 * d^2)``, r1 = ``bias_scale``, r2 = ``bias_a``."""
    return params["bias_scale"] * torch.exp(-params["bias_a"] * distance.square())


def power_bias(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """3-para-bias: ``r1 * exp(-r2 * d^r3)``, r1 = ``bias_scale``, r2 = ``bias_a``, r3 = ``bias_p``."""
    return params["bias_scale"] * torch.exp(-(params["bias_a"] * distance_power(distance, params["bias_p"])))


class GaussWeight1(LearnableKernel):
    """``gauss_wht1`` (A.3 1-para-wht): scale ``exp(-r1 * d^2)``, r1 = ``wei_a``."""

    kind = PositionKind.WEIGHT
    parameter_specs = {"wei_a": _COEFFICIENT}
    scale_formula = staticmethod(squared_weight)
    scale_export = ("exp", {"a": "wei_a", "p": 2})


class GaussWeight2(LearnableKernel):
    """``gauss_wht2`` (A.3 2-para-wht): scale ``exp(-r1 * d^r2)``, r1 = ``wei_a``, r2 = ``wei_p``."""

    kind = PositionKind.WEIGHT
    parameter_specs = {"wei_p": _POWER, "wei_a": _COEFFICIENT}
    scale_formula = staticmethod(power_weight)  # the same function as kerple_wht
    scale_export = ("exp", {"a": "wei_a", "p": "wei_p"})


class GaussBias2(LearnableKernel):
    """``gauss_bias2`` (A.3 2-para-bias): bias ``r1 * exp(-r2 * d^2)``, r1 = ``bias_scale``, r2 = ``bias_a``."""

    kind = PositionKind.BIAS
    parameter_specs = {"bias_scale": _AMPLITUDE, "bias_a": _COEFFICIENT}
    bias_formula = staticmethod(squared_bias)
    bias_export = ("exp", {"s": "bias_scale", "a": "bias_a", "p": 2})


class GaussBias3(LearnableKernel):
    """``gauss_bias3`` (A.3 3-para-bias): bias ``r1 * exp(-r2 * d^r3)``.

    r1 = ``bias_scale``, r2 = ``bias_a``, r3 = ``bias_p``.
    """

    kind = PositionKind.BIAS
    parameter_specs = {"bias_scale": _AMPLITUDE, "bias_p": _POWER, "bias_a": _COEFFICIENT}
    bias_formula = staticmethod(power_bias)
    bias_export = ("exp", {"s": "bias_scale", "a": "bias_a", "p": "bias_p"})
