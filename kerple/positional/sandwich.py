"""Sandwich and smoothed Sandwich (thesis "Toward Length-Extrapolatable Transformers" §4.6).

Sandwich (§4.6.1, Eq. (4.6)) keeps only the inner product of two sinusoidal embeddings,
``p_m·p_n = Σ_i cos((m - n) / 10000^(2i/d̄))``, shifts it so distance 0 maps to 0 and divides it
by ALiBi-like compression ratios ``h_n = n * 8 / H`` (``n = 1..H``):

    bias_n(d) = (Σ_{i=0}^{d̄/2-1} cos(d / 10000^(2i/d̄)) - d̄/2) / h_n,     d̄ = sandwich_dim (128)

Index convention: the thesis' equation writes ``Σ_{i=1}^{d̄/2}`` but its reference implementation
(§4.9.5) sums ``i = np.arange(d̄/2)``, i.e. ``i = 0 .. d̄/2 - 1`` - the same frequencies as the
sinusoidal embedding's ``inv_freq = 1/10000^(arange(0, d̄, 2)/d̄)``, from which Sandwich is
derived. We follow the implementation (the one that produced the thesis' numbers). Supporting
evidence: a least-squares log fit of the h = 8 curve over the 8192 positions of Fig. 4.9 gives
``-0.83 log(1+d) - 0.79`` with ``i`` from 0 but ``-0.84 log(1+d) - 0.61`` with ``i`` from 1; the
thesis reports ``-0.825 log(1+d) - 0.8`` (§4.6.2). The ``- d̄/2`` shift of Eq. (4.6) is a per-head
constant (the §4.9.5 code omits it) and does not change the softmax; we keep it so ``bias(0) = 0``.

d̄ is a hyperparameter decoupled from the model's width (§4.6.1); the thesis sets d̄ = 128 in all its
experiments, whose 162M model has head_dim 64 (its footnote 5, on how d̄ relates to d, is garbled in
the copy read here). ``sandwich_dim`` defaults to 128 for every model size: a model of another head
size gets the thesis' 128, not a d̄ scaled with its width.

Smoothed Sandwich (§4.6.2, footnote 7): per head, the least-squares fit ``-α·log(1+d) + β`` of the
Sandwich bias over its 50 most recent distances ``d = 0..49``; the fitted curve replaces Sandwich.

Both are parameter-free: tables are computed in float64, stored float32 and cached per
(k_len, device). With tensor parallelism, ``n`` is the global head index (``head_offset``) out of
``total_heads``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind, global_head_indices
from kerple.positional.logit_term import LogitTerm, per_head_term
from kerple.positional.options import must_be_even, option

SMOOTHING_POINTS = 50


def sandwich_profile(distance: torch.Tensor, sandwich_dim: int = 128) -> torch.Tensor:
    """``Σ_{i=0}^{d̄/2-1} cos(d / 10000^(2i/d̄)) - d̄/2`` in float64, same shape as ``distance``."""
    exponents = torch.arange(sandwich_dim // 2, dtype=torch.float64, device=distance.device) * 2 / sandwich_dim
    inv_freq = 1.0 / (10000.0**exponents)  # [d̄/2]
    angles = distance.to(torch.float64)[..., None] * inv_freq
    return angles.cos().sum(dim=-1) - sandwich_dim / 2


def compression_ratios(num_heads: int, head_offset: int = 0, total_heads: int | None = None) -> list[float]:
    """``h_n = n * 8 / total_heads`` for the global heads ``n = head_offset+1 .. head_offset+num_heads``."""
    total = total_heads if total_heads is not None else head_offset + num_heads
    return [(n + 1) * 8.0 / total for n in global_head_indices(num_heads, head_offset, total_heads)]


@dataclass(frozen=True)
class SandwichOptions:
    """Options of ``sandwich`` and ``sandwich_smoothed``."""

    sandwich_dim: int = option(
        128, "Sandwich dimension d-bar, even; 128 as every experiment of the thesis (4.6.1), whatever the head size.",
        minimum=2, check=must_be_even,
    )


class Sandwich(PositionalEmbedding):
    """``sandwich``: parameter-free bias ``sandwich_profile(d) / h_n`` (thesis Eq. (4.6))."""

    kind = PositionKind.BIAS
    options_class = SandwichOptions

    def __init__(self, shape: ModelShape, options: SandwichOptions = SandwichOptions()) -> None:
        super().__init__(shape)
        sandwich_dim = options.sandwich_dim
        if sandwich_dim < 2 or sandwich_dim % 2:
            raise ValueError(f"sandwich_dim must be even and >= 2, got {sandwich_dim}")
        self.sandwich_dim = sandwich_dim
        ratios = compression_ratios(shape.num_heads, shape.head_offset, shape.total_heads)
        # Not saved in checkpoints (the reference has no Sandwich); tracks the module's device.
        self.register_buffer("compression_ratio", torch.tensor(ratios, dtype=torch.float32), persistent=False)
        self._ratios64 = torch.tensor(ratios, dtype=torch.float64)
        self._table_cache: tuple[int, torch.device, torch.Tensor] | None = None

    def _table64(self, distance: torch.Tensor) -> torch.Tensor:
        """Float64 ``[H, len(distance)]`` bias table."""
        profile = sandwich_profile(distance, self.sandwich_dim)
        return profile[None, :] / self._ratios64.to(distance.device)[:, None]

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        device = torch.device(device) if device is not None else self.compression_ratio.device
        cache = self._table_cache
        if cache is None or cache[0] != k_len or cache[1] != device:
            distance = torch.arange(k_len, dtype=torch.float64, device=device)
            cache = (k_len, device, self._table64(distance).to(torch.float32))
            self._table_cache = cache
        return cache[2], None

    def export_terms(self) -> dict[str, dict[str, Any]]:
        return {"bias": {"form": "sandwich", "dim": self.sandwich_dim, "ratio": self._ratios64.tolist(), "float64": True}}


def fit_log_curve(distance: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row least squares of ``values [H, n] ≈ -α·log(1+d) + β``; returns ``(α [H], β [H])`` float64."""
    x = torch.log1p(distance.to(torch.float64))  # [n]
    y = values.to(torch.float64)
    x_centered = x - x.mean()
    slope = (y - y.mean(dim=-1, keepdim=True)) @ x_centered / x_centered.square().sum()
    intercept = y.mean(dim=-1) - slope * x.mean()
    return -slope, intercept


def smoothed_bias(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """``-α·log(1+d) + β`` (thesis §4.6.2), ``α = params["alpha"]``, ``β = params["beta"]``."""
    return -params["alpha"] * torch.log1p(distance) + params["beta"]


class SmoothedSandwich(Sandwich):
    """``sandwich_smoothed``: per-head fitted log curve ``-α_h·log(1+d) + β_h`` (thesis §4.6.2).

    α and β are fitted once at construction on ``d = 0..49`` of the head's Sandwich bias and kept
    as non-persistent float64 attributes (exposed as :attr:`alpha`, :attr:`beta`). The tables are
    computed in float64; the closed form (:meth:`logit_term`) in float32 from α and β rounded to
    float32, which differs from the float32-rounded table by a few float32 ulps.
    """

    def __init__(self, shape: ModelShape, options: SandwichOptions = SandwichOptions()) -> None:
        """The same keyword arguments as :class:`Sandwich`; the fit runs after its construction."""
        super().__init__(shape, options)
        fit_distance = torch.arange(SMOOTHING_POINTS, dtype=torch.float64)
        self.alpha, self.beta = fit_log_curve(fit_distance, super()._table64(fit_distance))

    def _table64(self, distance: torch.Tensor) -> torch.Tensor:
        alpha, beta = self.alpha.to(distance.device), self.beta.to(distance.device)
        return smoothed_bias({"alpha": alpha[:, None], "beta": beta[:, None]}, distance[None, :])

    def logit_term(self) -> LogitTerm:
        """``-α_h·log(1+d) + β_h`` per score from float32 ``[H]`` copies of α and β."""
        device = self.compression_ratio.device
        tensors = (self.alpha.to(device, torch.float32), self.beta.to(device, torch.float32))
        return LogitTerm(tensors, bias=per_head_term(smoothed_bias, ("alpha", "beta")))

    def export_terms(self) -> dict[str, dict[str, Any]]:
        """``-a * log(1 + b * d) + offset`` with ``a = α``, ``b = 1``, ``offset = β``, in float64."""
        curve = {"a": self.alpha.tolist(), "b": 1.0, "offset": self.beta.tolist()}
        return {"bias": {"form": "log", **curve, "float64": True}}


__all__ = [
    "Sandwich", "SandwichOptions", "SmoothedSandwich", "compression_ratios", "fit_log_curve", "sandwich_profile",
    "smoothed_bias",
]
