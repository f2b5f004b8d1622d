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
import inspect
from typing import Any

from kerple.positional.absolute import LearnedPositionalEmbedding, NoPositionalEmbedding, SinusoidalPositionalEmbedding
from kerple.positional.alibi import AlibiBias
from kerple.positional.base import PositionalEmbedding, PositionKind
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


def options_problem(
    name: str, options: dict[str, Any], *, head_dim: int, max_positions: int
) -> tuple[str, str] | None:
    """``(option, what is wrong)`` for the options of a config whose ``pos_emb`` is ``name``, or ``None``.

    An option declared with ``refuse_elsewhere`` and set here must be one the family declares:
    ``rope_scaling`` on a KERPLE model would otherwise be ignored without a word. Then the family's
    own :meth:`~PositionalEmbedding.options_problem` checks the values against the model's shape.
    """
    cls = family(name)
    declared = {field.name for field in dataclasses.fields(cls.options_class)} if cls.options_class else set()
    for spec in option_specs():
        if spec.refuse_elsewhere and options.get(spec.name) not in (None, spec.default) and spec.name not in declared:
            takers = ", ".join(n for n, c in _REGISTRY.items() if c.options_class and spec.name in
                               {f.name for f in dataclasses.fields(c.options_class)})
            return spec.name, f"is an option of {takers}; pos_emb {canonical(name)!r} does not take it, remove it"
    return cls.options_problem(options, head_dim=head_dim, max_positions=max_positions)


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
    """Build the embedding ``name``; its family receives the ``options`` its ``options_class`` declares.

    Names outside :func:`option_names` raise ``TypeError`` (typos must not pass silently); options
    of other families, and options set to ``None``, are ignored, so callers can pass every option
    of the config (``cfg.positional.options()``) unconditionally. ``head_offset`` and
    ``total_heads`` are not options: they give a tensor-parallel rank its slice of the heads and
    reach the families whose values depend on the global head index (those whose constructor
    takes them; :func:`kerple.positional.base.global_head_indices`). ``num_layers``, the model's
    layer count, reaches the families with per-layer parameters (``cable``) likewise.
    """
    unknown = sorted(set(options) - set(option_names()))
    if unknown:
        raise TypeError(f"unknown positional option(s) {unknown}; known: {sorted(option_names())}")
    cls = family(name)
    arguments: dict[str, Any] = {}
    if cls.options_class is not None:
        declared = {field.name for field in dataclasses.fields(cls.options_class)}
        given = {key: value for key, value in options.items() if key in declared and value is not None}
        arguments["options"] = cls.options_class(**given)
    parameters = inspect.signature(cls.__init__).parameters
    if "head_offset" in parameters:
        arguments.update(head_offset=head_offset, total_heads=total_heads)
    if "num_layers" in parameters:
        arguments["num_layers"] = num_layers
    return cls(num_heads=num_heads, head_dim=head_dim, hidden_size=hidden_size, max_positions=max_positions, **arguments)


__all__ = [
    "OptionSpec",
    "PositionKind",
    "PositionalEmbedding",
    "aliases",
    "build",
    "canonical",
    "family",
    "names",
    "option_names",
    "option_specs",
    "options_problem",
    "runtime_option_names",
]
