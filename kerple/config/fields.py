"""Field declarations for the config sections: metadata, type descriptions and type checks.

Every section field is declared with :func:`setting`, which records in the dataclass field's
``metadata`` the help text, the YAML keys that set it, whether it has an effect in this project,
numeric bounds and any further check. The loader, the validation and the generated reference
page (``docs/config.md``) all read this one description.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union


def setting(
    default: Any,
    help: str,
    *,
    keys: tuple[str, ...] = (),
    effect: bool = True,
    minimum: float | None = None,
    maximum: float | None = None,
    check: Callable[[Any], str | None] | None = None,
    derived: bool = False,
    refuse: str | None = None,
    block: bool = False,
    block_keys: tuple[str, ...] | None = None,
    value_aliases: dict[str, str] | None = None,
    refuse_values: dict[str, str] | None = None,
) -> Any:
    """Declare a section field.

    Args:
        default: the value when no file sets the key (lists and dicts are copied per instance).
        help: one or two sentences for the reference page.
        keys: YAML keys (underscore form; dotted for keys inside a DeepSpeed block, such as
            ``"optimizer.params.lr"``) that set this field. The first is the key ``to_dict``
            writes. Empty means the field's own name.
        effect: ``False`` for keys accepted only so that reference configs load; they are kept
            in the config and listed as "no effect" on the reference page.
        minimum, maximum: inclusive bounds checked for numbers.
        check: a rule bounds cannot express, ``value -> what is wrong`` (``"must be even"``) or
            ``None``; run on the merged value (never ``None``) when the config is validated.
        derived: computed after loading; not settable from a file.
        refuse: for a GPT-NeoX feature that kerple lacks, the feature's name: any value other than
            ``default`` is refused when the config loads (the default means "feature off").
        block: a DeepSpeed block kept as a whole mapping and merged key by key across files.
        block_keys: for a ``block``, the inner keys DeepSpeed accepts (``None``: any key).
        value_aliases: other GPT-NeoX spellings of a value, stored as the value they name
            (``{"silu": "swish"}``).
        refuse_values: GPT-NeoX values that select a feature kerple lacks -> that feature, refused
            with one line when the file is read.
    """
    metadata = {
        "help": help,
        "keys": tuple(keys),
        "effect": effect,
        "minimum": minimum,
        "maximum": maximum,
        "check": check,
        "derived": derived,
        "refuse": refuse,
        "block": block,
        "block_keys": block_keys,
        "value_aliases": value_aliases or {},
        "refuse_values": refuse_values or {},
    }
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def describe_type(hint: Any) -> str:
    """A reader-facing name for a type hint: ``int``, ``float or null``, ``one of 'a', 'b'``."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        text = " or ".join(describe_type(arg) for arg in members)
        return f"{text} or null" if len(members) < len(typing.get_args(hint)) else text
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return "list" if item is Any else f"list of {describe_type(item)}"
    if origin is dict or hint is dict:
        return "mapping"
    if hint is list:
        return "list"
    if hint is Any:
        return "any"
    return getattr(hint, "__name__", str(hint))


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class TypeMismatch(Exception):
    """Raised by :func:`check_value`; the message says what was expected and what was given."""


def check_value(value: Any, hint: Any) -> Any:
    """Return ``value`` checked against ``hint`` (ints become floats for float fields).

    Raises :class:`TypeMismatch` with "expected X, got Y" when it does not fit. ``bool`` is not
    accepted for numbers, nor numbers for ``bool``.
    """
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        members = typing.get_args(hint)
        if value is None and type(None) in members:
            return None
        for member in members:
            if member is type(None):
                continue
            try:
                return check_value(value, member)
            except TypeMismatch:
                continue
        raise TypeMismatch(f"expected {describe_type(hint)}, got {_type_name(value)} ({value!r})")
    if origin is Literal:
        if value in typing.get_args(hint) and isinstance(value, str):
            return value
        raise TypeMismatch(f"expected {describe_type(hint)}, got {value!r}")
    if origin is list or hint is list:
        if not isinstance(value, list):
            raise TypeMismatch(f"expected {describe_type(hint)}, got {_type_name(value)} ({value!r})")
        (item,) = typing.get_args(hint) or (Any,)
        checked = []
        for position, element in enumerate(value):
            try:
                checked.append(check_value(element, item))
            except TypeMismatch as error:
                raise TypeMismatch(f"item {position}: {error}") from None
        return checked
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TypeMismatch(f"expected a mapping, got {_type_name(value)} ({value!r})")
        return copy.deepcopy(value)
    if hint is Any:
        return copy.deepcopy(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"config fields cannot use the type {hint!r}")
    raise TypeMismatch(f"expected {describe_type(hint)}, got {_type_name(value)} ({value!r})")


def check_bounds(value: Any, metadata: typing.Mapping[str, Any]) -> str | None:
    """Why a number is outside the field's ``minimum``/``maximum``, or ``None`` when it is inside. NaN
    and the infinities are outside every field (a NaN learning rate reached the optimizer on rank 0)."""
    low, high = metadata.get("minimum"), metadata.get("maximum")
    numbers = value if isinstance(value, list) else [value]
    for number in numbers:
        if not isinstance(number, (int, float)) or isinstance(number, bool):
            continue
        if not math.isfinite(number):
            return f"must be a finite number, got {number}"
        if low is not None and number < low:
            return f"must be >= {low}, got {number}"
        if high is not None and number > high:
            return f"must be <= {high}, got {number}"
    return None
