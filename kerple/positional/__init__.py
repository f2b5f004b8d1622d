"""Every positional embedding of the papers behind one registry (one line per name).

``build(name, ...)`` is the only entry point the model needs; adding an embedding means one new
class (see :mod:`kerple.positional.base`) and one line in ``_REGISTRY``. Adding a config option
means one field in its family's options dataclass (:mod:`kerple.positional.options`): the config
section, the checkpoint readers and the converters read :func:`option_specs` / :func:`option_names`.
Reference ``pos_emb`` strings of the GPT-NeoX KERPLE fork (docs/reference-format.md §1) resolve
through ``_ALIASES``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kerple.positional.absolute import LearnedPositionalEmbedding, NoPositionalEmbedding, SinusoidalPositionalEmbedding
from kerple.positional.alibi import AlibiBias
from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind
from kerple.positional.cable import Cable
from kerple.positional.fire import Fire
from kerple.positional.gaussian import GaussBias2, GaussBias3, GaussWeight1, GaussWeight2
from kerple.positional.kerple import (
    KerpleBiasWeight,
    KerpleLog,
    KerpleLog3,
    KerplePower,
    KerplePowerOriginal,
    KerpleWeight,
)
from kerple.positional.options import OptionSpec, declared_options
from kerple.positional.rotary import RotaryEmbedding
from kerple.positional.sandwich import Sandwich, SmoothedSandwich
from kerple.positional.t5 import T5RelativeBias
from kerple.positional.xpos import XposEmbedding

_REGISTRY: dict[str, type[PositionalEmbedding]] = {
    "none": NoPositionalEmbedding,  # NoPE, thesis ch. 2
    "learned": LearnedPositionalEmbedding,  # docs/reference-format.md §3
    "sinusoidal": SinusoidalPositionalEmbedding,  # docs/reference-format.md §3
    "rotary": RotaryEmbedding,  # docs/reference-format.md §3
    "alibi": AlibiBias,  # docs/reference-format.md §3, thesis Table 4.1
    "rpe": T5RelativeBias,  # T5 bias, KERPLE paper §4
    "kerple_log": KerpleLog,  # KERPLE paper §4 logarithmic
    "kerple_power": KerplePower,  # KERPLE paper §4 power
    "kerple_log3": KerpleLog3,  # KERPLE paper §5.3 3-para-log
    "kerple_bias_wht": KerpleBiasWeight,  # KERPLE paper §5.3 bias+wht
    "kerple_wht": KerpleWeight,  # reference kerple_power__ap
    "kerple_power_original": KerplePowerOriginal,  # reference: ALiBi slopes via the power class
    "gauss_wht1": GaussWeight1,  # KERPLE Appendix A.3 1-para-wht
    "gauss_wht2": GaussWeight2,  # KERPLE Appendix A.3 2-para-wht
    "gauss_bias2": GaussBias2,  # KERPLE Appendix A.3 2-para-bias
    "gauss_bias3": GaussBias3,  # KERPLE Appendix A.3 3-para-bias
    "sandwich": Sandwich,  # thesis §4.6.1
    "sandwich_smoothed": SmoothedSandwich,  # thesis §4.6.2
    "fire": Fire,  # Li et al. 2023, FIRE (arXiv 2310.04418)
    "cable": Cable,  # Veisi et al. 2025, CABLE (arXiv 2503.08067)
    "xpos": XposEmbedding,  # Sun et al. 2022, xPos (arXiv 2212.10554)
}

_ALIASES: dict[str, str] = {
    "t5": "rpe",
    "kerple_power_ap_": "kerple_power",
    "kerple_power_ap_ap": "kerple_bias_wht",
    "kerple_power__ap": "kerple_wht",
}

def names() -> list[str]:
    """Canonical registry names, in registry order."""
    return list(_REGISTRY)


def aliases() -> dict[str, str]:
    """Alias -> canonical name (reference ``pos_emb`` strings and short forms)."""
    return dict(_ALIASES)


def canonical(name: str) -> str:
    """Resolve ``name`` (canonical, alias or reference string; case-insensitive) to its canonical name.

    Raises ``KeyError`` listing the valid names.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        valid = ", ".join(names())
        known_aliases = ", ".join(f"{alias} -> {target}" for alias, target in _ALIASES.items())
        raise KeyError(f"unknown positional embedding {name!r}; valid names: {valid} (aliases: {known_aliases})")
    return key


def family(name: str) -> type[PositionalEmbedding]:
    """The class implementing ``name`` (aliases accepted)."""
    return _REGISTRY[canonical(name)]


def option_specs() -> tuple[OptionSpec, ...]:
    """Every option declared by a registered family's ``options_class``, once, in registry order.

    Families may share an options class (``sandwich``, ``sandwich_smoothed``) or extend one by
    subclassing it (``xpos``'s options add to ``rotary``'s, whose fields it inherits); two unrelated
    classes that declare the same name are a programming error (``RuntimeError``): a YAML key sets
    one option.
    """
    specs: dict[str, OptionSpec] = {}
    owners: dict[str, type] = {}
    for cls in _REGISTRY.values():
        options_class = cls.options_class
        if options_class is None or options_class in owners.values():
            continue
        for spec in declared_options(options_class):
            owner = owners.get(spec.name)
            if owner is not None and (issubclass(options_class, owner) or issubclass(owner, options_class)):
                continue  # the same field, inherited
            if spec.name in specs:
                raise RuntimeError(
                    f"positional option {spec.name!r} is declared by {owners[spec.name].__name__} and {options_class.__name__}"
                )
            specs[spec.name], owners[spec.name] = spec, options_class
    return tuple(specs.values())


def option_names() -> tuple[str, ...]:
    """The config keys of every positional option (:func:`option_specs`), in registry order."""
    return tuple(spec.name for spec in option_specs())


def runtime_option_names() -> tuple[str, ...]:
    """The options that say how a trained model is run, not what its weights mean (declared with
    ``weights_bound=False``): a checkpoint's recorded value does not bind them."""
    return tuple(spec.name for spec in option_specs() if not spec.weights_bound)


def unset_value(name: str, value: Any) -> Any:
    """``value`` of the run-time option ``name``, or ``None`` where it spells out the option's absence
    (``Variant.unset``): two values that mean the same compare equal after this."""
    variant = _runtime_spec(name).variant
    return None if variant is not None and value in variant.unset else value


def variant_tags(options: dict[str, Any]) -> tuple[str, ...]:
    """The tags of the run-time options that ``options`` (a config's, or a ``results.json`` run) sets to
    something other than unset, in registry order: the part of a run's variant name after its ``pos_emb``."""
    tags = []
    for name in runtime_option_names():
        variant = _runtime_spec(name).variant
        value = unset_value(name, options.get(name))
        tag = variant.tag(value) if variant is not None and value is not None else None
        if tag is not None:
            tags.append(tag)
    return tuple(tags)


def variant_names() -> dict[str, str]:
    """Every run-time option's variant tag -> the name shown in tables, in the order tables list them."""
    return {tag: shown for name in runtime_option_names() if (variant := _runtime_spec(name).variant)
            for tag, shown in variant.names.items()}


def _runtime_spec(name: str) -> OptionSpec:
    return next(spec for spec in option_specs() if spec.name == name and not spec.weights_bound)


def options_problem(name: str, options: dict[str, Any], shape: ModelShape) -> tuple[str, str] | None:
    """``(option, what is wrong)`` for the options of a config whose ``pos_emb`` is ``name``, or ``None``.

    ``options`` are the config's, by name (``None`` where unset). An option declared with
    ``refuse_elsewhere`` and set here must be one the family declares: ``rope_scaling`` on a KERPLE
    model would otherwise be ignored without a word. Then the family's own
    :meth:`~PositionalEmbedding.options_problem` checks its options, as the constructor would take
    them (:func:`family_options`), against the model's ``shape``.
    """
    cls = family(name)
    declared = _declared(cls)
    for spec in option_specs():
        if spec.refuse_elsewhere and options.get(spec.name) not in (None, spec.default) and spec.name not in declared:
            takers = ", ".join(n for n, c in _REGISTRY.items() if spec.name in _declared(c))
            return spec.name, f"is an option of {takers}; pos_emb {canonical(name)!r} does not take it, remove it"
    if cls.options_class is None:
        return None
    return cls.options_problem(family_options(cls, options), shape)


def length_problem(
    name: str, options: dict[str, Any], shape: ModelShape, length: int, dtype: torch.dtype
) -> str | None:
    """Why a model with ``pos_emb`` ``name`` cannot compute ``length`` positions in ``dtype``, or ``None``
    (the family's :meth:`~PositionalEmbedding.length_problem`, given its options as :func:`build` would)."""
    cls = family(name)
    return cls.length_problem(None if cls.options_class is None else family_options(cls, options), shape, length, dtype)


def _declared(cls: type[PositionalEmbedding]) -> set[str]:
    return {field.name for field in dataclasses.fields(cls.options_class)} if cls.options_class else set()


def family_options(cls: type[PositionalEmbedding], options: dict[str, Any]) -> Any:
    """The instance of ``cls.options_class`` holding the values of ``options`` it declares (``None``
    values left at their defaults): what :func:`build` gives the constructor."""
    declared = _declared(cls)
    return cls.options_class(**{key: value for key, value in options.items() if key in declared and value is not None})


def build(
    name: str,
    *,
    num_heads: int,
    head_dim: int,
    hidden_size: int,
    max_positions: int,
    head_offset: int = 0,
    total_heads: int | None = None,
    num_layers: int = 1,
    **options: Any,
) -> PositionalEmbedding:
    """Build the embedding ``name`` for the :class:`ModelShape` these keywords give; its family receives
    the ``options`` its ``options_class`` declares.

    Names outside :func:`option_names` raise ``TypeError`` (typos must not pass silently); options
    of other families, and options set to ``None``, are ignored, so callers can pass every option
    of the config (``cfg.positional.options()``) unconditionally. ``head_offset`` and
    ``total_heads`` are not options: they give a tensor-parallel rank its slice of the heads
    (:func:`kerple.positional.base.global_head_indices`); ``num_layers`` is the model's layer count.
    """
    unknown = sorted(set(options) - set(option_names()))
    if unknown:
        raise TypeError(f"unknown positional option(s) {unknown}; known: {sorted(option_names())}")
    cls = family(name)
    shape = ModelShape(num_heads=num_heads, head_dim=head_dim, hidden_size=hidden_size, max_positions=max_positions,
                       num_layers=num_layers, head_offset=head_offset, total_heads=total_heads)
    if cls.options_class is None:
        return cls(shape)
    return cls(shape, family_options(cls, options))  # type: ignore[call-arg]


__all__ = [
    "ModelShape",
    "OptionSpec",
    "PositionKind",
    "PositionalEmbedding",
    "aliases",
    "build",
    "canonical",
    "family",
    "family_options",
    "length_problem",
    "names",
    "option_names",
    "option_specs",
    "options_problem",
    "runtime_option_names",
    "unset_value",
    "variant_names",
    "variant_tags",
]
