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

from typing import Any

import torch

from kerple.positional.base import PositionKind
from kerple.positional.functional import distance_power
from kerple.positional.kerple import MAX_EXPONENT, MIN_VALUE, LearnableKernel

_COEFFICIENT = (1.0, MIN_VALUE, None)
_POWER = (2.0, MIN_VALUE, MAX_EXPONENT)
_AMPLITUDE = (2.0, MIN_VALUE, None)


class GaussWeight1(LearnableKernel):
    """``gauss_wht1`` (A.3 1-para-wht): scale ``exp(-r1 * d^2)``, r1 = ``wei_a``."""

    kind = PositionKind.WEIGHT
    parameter_specs = {"wei_a": _COEFFICIENT}

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        distance = self.distances(k_len, device)
        return None, torch.exp(-self.effective("wei_a") * distance.square())

    def export_terms(self) -> dict[str, dict[str, Any]]:
        return {"weight": {"form": "exp", "a": self.tensor_reference("wei_a"), "p": 2}}


class GaussWeight2(LearnableKernel):
    """``gauss_wht2`` (A.3 2-para-wht): scale ``exp(-r1 * d^r2)``, r1 = ``wei_a``, r2 = ``wei_p``."""

    kind = PositionKind.WEIGHT
    parameter_specs = {"wei_p": _POWER, "wei_a": _COEFFICIENT}

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        distance = self.distances(k_len, device)
        decay = self.effective("wei_a") * distance_power(distance, self.effective("wei_p"))
        return None, torch.exp(-decay)

    def export_terms(self) -> dict[str, dict[str, Any]]:
        return {"weight": {"form": "exp", "a": self.tensor_reference("wei_a"), "p": self.tensor_reference("wei_p")}}


class GaussBias2(LearnableKernel):
    """``gauss_bias2`` (A.3 2-para-bias): bias ``r1 * exp(-r2 * d^2)``, r1 = ``bias_scale``, r2 = ``bias_a``."""

    kind = PositionKind.BIAS
    parameter_specs = {"bias_scale": _AMPLITUDE, "bias_a": _COEFFICIENT}

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        distance = self.distances(k_len, device)
        return self.effective("bias_scale") * torch.exp(-self.effective("bias_a") * distance.square()), None

    def export_terms(self) -> dict[str, dict[str, Any]]:
        amplitude = {"s": self.tensor_reference("bias_scale"), "a": self.tensor_reference("bias_a")}
        return {"bias": {"form": "exp", **amplitude, "p": 2}}


class GaussBias3(LearnableKernel):
    """``gauss_bias3`` (A.3 3-para-bias): bias ``r1 * exp(-r2 * d^r3)``.

    r1 = ``bias_scale``, r2 = ``bias_a``, r3 = ``bias_p``.
    """

    kind = PositionKind.BIAS
    parameter_specs = {"bias_scale": _AMPLITUDE, "bias_p": _POWER, "bias_a": _COEFFICIENT}

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        distance = self.distances(k_len, device)
        decay = self.effective("bias_a") * distance_power(distance, self.effective("bias_p"))
        return self.effective("bias_scale") * torch.exp(-decay), None

    def export_terms(self) -> dict[str, dict[str, Any]]:
        names = {"s": "bias_scale", "a": "bias_a", "p": "bias_p"}
        return {"bias": {"form": "exp", **{key: self.tensor_reference(name) for key, name in names.items()}}}
