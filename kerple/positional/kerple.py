"""KERPLE: kernelized relative positional embeddings (Chi et al. 2022).

Every variant plugs a conditionally positive definite kernel of the distance ``d = |m - n|`` into
the attention logits, KERPLE paper Eq. (2)-(4): ``q·k`` (optionally times a weight kernel) plus a
bias kernel; the constant ``c`` of Eq. (3) drops out of the softmax. Variants here:

* ``kerple_log`` (paper §4, logarithmic):     bias = -r1 * log(1 + r2 * d)
* ``kerple_power`` (paper §4, power):         bias = -r1 * d^r2,            0 < r2 <= 2
* ``kerple_log3`` (paper §5.3, 3-para-log):   bias = -r1 * log(1 + r2 * d^r3), 0 < r3 <= 2
* ``kerple_bias_wht`` (paper §5.3, bias+wht): logits * exp(-r3 * d^r4) + (-r1 * d^r2)
* ``kerple_wht`` (weight only):               logits * exp(-r1 * d^r2)
* ``kerple_power_original``: the reference's ALiBi-through-the-power-class (see its class).

Parameters follow the GPT-NeoX KERPLE fork (docs/reference-format.md §2): one ``[H, 1, 1]`` tensor per name,
one set per model shared by all layers, ``*_p`` initialised U(0, 2) and ``*_a`` U(0, 1), created
in the order ``bias_p, bias_a, wei_p, wei_a`` (so seeded runs draw the same values). The forward
uses clamped values (every ``a >= 0.01``, power exponents in ``[0.01, 2]``, the log variant's r1
``>= 0.01``) with the gradient passed straight through (see :func:`straight_through_clamp`). All
math is fp32 (the reference uses bf16 distances; docs/reference-format.md §2).

Each variant is written once, as a *formula* of its parameters and the distance that broadcasts:
the distance tables evaluate it with ``[H, 1]`` parameters and ``[1, L]`` distances, fused kernels
with the parameters of one head and one score's distance (the closed form of
:meth:`LearnableKernel.logit_term`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from kerple.positional.alibi import alibi_slopes, linear_bias
from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind
from kerple.positional.functional import distance_power, distance_vector, straight_through_clamp
from kerple.positional.logit_term import LogitTerm, per_head_term

Formula = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]
# A term's form in the Hugging Face export: (form of modeling_kerple.py, {its parameter: a parameter
# name of the family, or a number}); see PositionalEmbedding.export_terms
ExportForm = tuple[str, dict[str, Any]]

MIN_VALUE = 0.01
MAX_EXPONENT = 2.0


class LearnableKernel(PositionalEmbedding):
    """Base of the learnable kernel families (KERPLE and the Gaussian-like kernels).

    Subclasses list their parameters in ``parameter_specs``: ``name -> (init_scale, clamp_min,
    clamp_max)``; each parameter is ``init_scale * U(0, 1)`` of shape ``[H, 1, 1]``, created in
    the listed order. :meth:`effective` returns the clamped (straight-through) value as float32
    ``[H, 1]``. Only the distance vector is cached.

    The terms are the static ``bias_formula`` and ``scale_formula`` (either may be ``None``): each
    maps ``{name: parameter}`` and the float32 distance to the term, reading the parameters named
    ``bias_*`` (the bias) or ``wei_*`` (the weight, i.e. the logit scale), the reference's naming.
    ``bias_export`` and ``scale_export`` name the same formulas for the Hugging Face export
    (:meth:`export_terms`).
    """

    state_dict_name = "rpe"
    learnable = True
    parameter_specs: dict[str, tuple[float, float, float | None]] = {}
    bias_formula: Formula | None = None
    scale_formula: Formula | None = None
    bias_export: ExportForm | None = None
    scale_export: ExportForm | None = None

    def __init__(self, shape: ModelShape) -> None:
        super().__init__(shape)
        for name, (init_scale, _, _) in self.parameter_specs.items():
            self.register_parameter(name, nn.Parameter(torch.rand(shape.num_heads, 1, 1) * init_scale))
        self._distance_cache: tuple[int, torch.device, torch.Tensor] | None = None

    def effective(self, name: str) -> torch.Tensor:
        """The value of parameter ``name`` used in the forward: clamped, fp32, ``[H, 1]``."""
        _, low, high = self.parameter_specs[name]
        param = getattr(self, name).float().reshape(self.num_heads, 1)
        return straight_through_clamp(param, low, high)

    def tensor_reference(self, name: str) -> dict[str, Any]:
        """Parameter ``name`` for :meth:`export_terms`: its key and its clamp bounds."""
        _, low, high = self.parameter_specs[name]
        return {"tensor": name, "min": low} if high is None else {"tensor": name, "min": low, "max": high}

    def export_terms(self) -> dict[str, dict[str, Any]]:
        """``bias_export`` as the ``bias`` term and ``scale_export`` as the ``weight`` term."""
        terms = {}
        for place, export in (("bias", self.bias_export), ("weight", self.scale_export)):
            if export is not None:
                form, parameters = export
                values = {key: self.tensor_reference(value) if isinstance(value, str) else value for key, value in parameters.items()}
                terms[place] = {"form": form, **values}
        return terms

    def distances(self, k_len: int, device: torch.device | None = None) -> torch.Tensor:
        """Float32 ``[1, k_len]`` distances ``0..k_len-1``, cached per (k_len, device)."""
        device = torch.device(device) if device is not None else self._device()
        cache = self._distance_cache
        if cache is None or cache[0] != k_len or cache[1] != device:
            cache = (k_len, device, distance_vector(k_len, device)[None, :])
            self._distance_cache = cache
        return cache[2]

    def _term_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Parameter names read by the bias (``bias_*``) and by the logit scale (``wei_*``)."""
        bias = tuple(name for name in self.parameter_specs if name.startswith("bias_"))
        scale = tuple(name for name in self.parameter_specs if name.startswith("wei_"))
        return bias, scale

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The formulas with ``[H, 1]`` parameters at distances ``[1, k_len]``: float32 ``[H, k_len]``."""
        distance = self.distances(k_len, device)
        tables = []
        for formula, names in zip((self.bias_formula, self.scale_formula), self._term_names()):
            params = {name: self.effective(name) for name in names}  # each [H, 1]
            tables.append(None if formula is None else formula(params, distance))
        return tables[0], tables[1]

    def logit_term(self) -> LogitTerm:
        """The formulas per score, reading the effective parameters ``[H]`` (captured tensors)."""
        bias_names, scale_names = self._term_names()
        tensors = tuple(self.effective(name).reshape(self.num_heads) for name in bias_names + scale_names)
        bias = None if self.bias_formula is None else per_head_term(self.bias_formula, bias_names)
        scale = None if self.scale_formula is None else per_head_term(self.scale_formula, scale_names, len(bias_names))
        return LogitTerm(tensors, bias=bias, scale=scale)

    def metrics(self) -> dict[str, float]:
        """Per-head effective values (``bias_p/head3``) and their mean/std/min/max per parameter."""
        stats: dict[str, float] = {}
        for name in self.parameter_specs:
            values = self.effective(name).detach().flatten()
            for head, value in enumerate(values.tolist()):
                stats[f"{name}/head{head}"] = value
            stats[f"{name}/mean"] = values.mean().item()
            stats[f"{name}/std"] = values.std().item() if values.numel() > 1 else 0.0
            stats[f"{name}/min"] = values.min().item()
            stats[f"{name}/max"] = values.max().item()
        return stats


def log_bias(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """``-r1 * log(1 + r2 * d)`` (KERPLE paper §4, logarithmic), r1 = ``bias_p``, r2 = ``bias_a``."""
    return -params["bias_p"] * torch.log1p(params["bias_a"] * distance)


def log3_bias(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """``-r1 * log(1 + r2 * d^r3)`` (KERPLE paper §5.3, 3-para-log), r3 = ``bias_pow``."""
    return -params["bias_p"] * torch.log1p(params["bias_a"] * distance_power(distance, params["bias_pow"]))


def power_bias(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """``-(d^p * a)`` with p = ``bias_p``, a = ``bias_a`` (KERPLE paper §4, power; NeoX order)."""
    return -(distance_power(distance, params["bias_p"]) * params["bias_a"])


def power_weight(params: dict[str, torch.Tensor], distance: torch.Tensor) -> torch.Tensor:
    """``exp(-(d^p * a))`` with p = ``wei_p``, a = ``wei_a`` (KERPLE paper §5.3, the weight kernel)."""
    return torch.exp(-(distance_power(distance, params["wei_p"]) * params["wei_a"]))


class KerpleLog(LearnableKernel):
    """``kerple_log``: bias ``-r1 * log(1 + r2 * d)``, r1 = ``bias_p``, r2 = ``bias_a`` (paper §4).

    Clamps as the reference: both ``>= 0.01`` (r1 has no upper bound).
    """

    kind = PositionKind.BIAS
    parameter_specs = {"bias_p": (2.0, MIN_VALUE, None), "bias_a": (1.0, MIN_VALUE, None)}
    bias_formula = staticmethod(log_bias)
    bias_export = ("log", {"a": "bias_p", "b": "bias_a"})


class KerpleLog3(LearnableKernel):
    """``kerple_log3`` (paper §5.3, 3-para-log): bias ``-r1 * log(1 + r2 * d^r3)``.

    The reference has no such class; names extend the log variant's: r1 = ``bias_p`` (U(0,2),
    ``>= 0.01``), r2 = ``bias_a`` (U(0,1), ``>= 0.01``) exactly as in ``kerple_log``, and the new
    exponent r3 = ``bias_pow`` (U(0,2) like every KERPLE exponent, clamped to ``[0.01, 2]``).
    With r3 = 1 it reduces to ``kerple_log``.
    """

    kind = PositionKind.BIAS
    parameter_specs = {
        "bias_p": (2.0, MIN_VALUE, None),
        "bias_a": (1.0, MIN_VALUE, None),
        "bias_pow": (2.0, MIN_VALUE, MAX_EXPONENT),
    }
    bias_formula = staticmethod(log3_bias)
    bias_export = ("log", {"a": "bias_p", "b": "bias_a", "p": "bias_pow"})


_POWER = (2.0, MIN_VALUE, MAX_EXPONENT)
_COEFFICIENT = (1.0, MIN_VALUE, None)
_POWER_BIAS_EXPORT = ("power", {"a": "bias_a", "p": "bias_p"})
_POWER_WEIGHT_EXPORT = ("exp", {"a": "wei_a", "p": "wei_p"})


class KerplePower(LearnableKernel):
    """``kerple_power`` (reference ``kerple_power_ap_``; paper §4 power): bias ``-r1 * d^r2``.

    r1 = ``bias_a`` (``>= 0.01``), r2 = ``bias_p`` (``[0.01, 2]``): NeoX's ``-bias_a * d**bias_p``.
    The reference's ``ParallelKerplePower`` with its ``_X_Y`` suffix naming which of the bias (X)
    and weight (Y) parameters exist; every ``a`` is clamped ``>= 0.01``, every ``p`` to ``[0.01, 2]``.
    """

    kind = PositionKind.BIAS
    parameter_specs = {"bias_p": _POWER, "bias_a": _COEFFICIENT}
    bias_formula = staticmethod(power_bias)
    bias_export = _POWER_BIAS_EXPORT


class KerpleBiasWeight(LearnableKernel):
    """``kerple_bias_wht`` (reference ``kerple_power_ap_ap``; paper §5.3 bias+wht).

    ``logits * exp(-r3 * d^r4) + (-r1 * d^r2)`` with r1 = ``bias_a``, r2 = ``bias_p``,
    r3 = ``wei_a``, r4 = ``wei_p``.
    """

    kind = PositionKind.WEIGHT
    parameter_specs = {"bias_p": _POWER, "bias_a": _COEFFICIENT, "wei_p": _POWER, "wei_a": _COEFFICIENT}
    bias_formula = staticmethod(power_bias)
    scale_formula = staticmethod(power_weight)
    bias_export, scale_export = _POWER_BIAS_EXPORT, _POWER_WEIGHT_EXPORT


class KerpleWeight(LearnableKernel):
    """``kerple_wht`` (reference ``kerple_power__ap``): ``logits * exp(-r1 * d^r2)``, no bias.

    r1 = ``wei_a`` (``>= 0.01``), r2 = ``wei_p`` (``[0.01, 2]``). Same function as Appendix A.3's
    2-para-wht (``gauss_wht2``).
    """

    kind = PositionKind.WEIGHT
    parameter_specs = {"wei_p": _POWER, "wei_a": _COEFFICIENT}
    scale_formula = staticmethod(power_weight)
    scale_export = _POWER_WEIGHT_EXPORT


class KerplePowerOriginal(PositionalEmbedding):
    """``kerple_power_original``: ALiBi through the reference's power class.

    The reference stores the standard ALiBi slopes (of the global heads) as a *frozen* ``bias_a``
    ``[H, 1, 1]`` and computes ``-bias_a * d`` - but its power class clamps every ``a`` to
    ``>= 0.01`` before the forward, so slopes below 0.01 (``2^-7``, ``2^-8`` for 8 or 12 heads)
    act as 0.01. This class reproduces that exactly: bias ``-max(slope, 0.01) * d``. It therefore
    differs from ``alibi`` on the shallowest heads, which is why it is not an alias of it.
    ``bias_a`` is a buffer (not trained) so checkpoints keep the reference key ``rpe.bias_a``.
    """

    kind = PositionKind.BIAS
    state_dict_name = "rpe"

    def __init__(self, shape: ModelShape) -> None:
        super().__init__(shape)
        slopes = alibi_slopes(shape.all_heads)
        local = torch.tensor([slopes[h] for h in shape.head_indices()], dtype=torch.float32)
        self.register_buffer("bias_a", local[:, None, None])

    def _slopes(self, device: torch.device | str | None = None) -> torch.Tensor:
        """``max(bias_a, 0.01)`` as float32 ``[H]``."""
        return self.bias_a.to(device, torch.float32).reshape(self.num_heads).clamp(min=MIN_VALUE)

    def distance_tables(
        self, k_len: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        distance = distance_vector(k_len, device)[None, :]
        return -self._slopes(distance.device)[:, None] * distance, None

    def logit_term(self) -> LogitTerm:
        """``-max(slope_h, 0.01) * d`` per score from the ``[H]`` slopes."""
        return LogitTerm((self._slopes(),), bias=per_head_term(linear_bias, ("slope",)))

    def export_terms(self) -> dict[str, dict[str, Any]]:
        """``-a * d`` with ``a = max(bias_a, 0.01)``."""
        return {"bias": {"form": "power", "a": {"tensor": "bias_a", "min": MIN_VALUE}}}
