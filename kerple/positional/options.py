"""How a positional family declares its options: once, as a frozen dataclass beside the family.

Each option is one field declared with :func:`option` (type annotation, default, one-line help,
numeric bounds, and an optional extra check); the family class names the dataclass in its
``options_class`` attribute and receives one instance of it. Everything else derives from these
declarations through :func:`kerple.positional.option_specs`: the registry's known options and
what :func:`kerple.positional.build` passes to each family, the fields, checks and reference page
(``docs/config.md``) of the ``positional`` config section, and the option lists of the checkpoint
readers and converters. The config's YAML key of an option is the field's name.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Check = Callable[[Any], str | None]
"""A rule bounds cannot express: ``value -> what is wrong`` (e.g. ``"must be even"``) or ``None``."""


@dataclass(frozen=True)
class Variant:
    """How the values of a run-time option name variants of a run in result tables (``rotary+yarn``,
    shown "Rotary + YaRN"): ``tag(value)`` is the short name of a value (``None`` where the value
    changes nothing, as unset), ``names`` maps each tag to the name shown, in the order tables list
    them; ``unset`` are the spelled-out values that mean the same as leaving the option unset."""

    tag: Callable[[Any], str | None]
    names: dict[str, str]
    unset: tuple[Any, ...] = ()


def option(
    default: Any,
    help: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    check: Check | None = None,
    refuse_elsewhere: bool = False,
    weights_bound: bool = True,
    variant: Variant | None = None,
) -> Any:
    """Declare one option field of a family's options dataclass.

    Args:
        default: the value when no config sets the option.
        help: one sentence for the config reference page.
        minimum, maximum: inclusive bounds, checked when a config file sets the key.
        check: a further rule, checked when the config is validated (never given ``None``).
        refuse_elsewhere: a config whose ``pos_emb`` does not declare the option may not set it
            (other options of other families are ignored, so that one file serves several embeddings).
        weights_bound: ``False`` for a setting of how a trained model is run rather than of what its
            weights mean (``rope_scaling``: zero-shot context extension); loading a checkpoint then
            does not compare the recorded value with the config's.
        variant: for a run-time option, how its values name variants of a run (:class:`Variant`).
    """
    metadata = {"help": help, "minimum": minimum, "maximum": maximum, "check": check,
                "refuse_elsewhere": refuse_elsewhere, "weights_bound": weights_bound, "variant": variant}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class OptionSpec:
    """One declared option, as the config section and the checkpoint code read it."""

    name: str
    hint: Any  # the resolved type annotation, e.g. ``float`` or ``int | None``
    default: Any
    help: str
    minimum: float | None
    maximum: float | None
    check: Check | None
    refuse_elsewhere: bool = False
    weights_bound: bool = True
    variant: Variant | None = None


def declared_options(options_class: type) -> tuple[OptionSpec, ...]:
    """The options an options dataclass declares, in declaration order."""
    hints = typing.get_type_hints(options_class)
    return tuple(
        OptionSpec(
            name=field.name,
            hint=hints[field.name],
            default=field.default,
            help=field.metadata["help"],
            minimum=field.metadata["minimum"],
            maximum=field.metadata["maximum"],
            check=field.metadata["check"],
            refuse_elsewhere=field.metadata["refuse_elsewhere"],
            weights_bound=field.metadata["weights_bound"],
            variant=field.metadata["variant"],
        )
        for field in dataclasses.fields(options_class)
    )


def must_be_even(value: int) -> str | None:
    """A :data:`Check` for sizes split into pairs."""
    return "must be even" if value % 2 else None
