"""Routing of GPT-NeoX / DeepSpeed YAML keys to section fields.

A YAML file is a flat mapping of NeoX keys (``hidden-size``, ``pos_emb``, ...) plus DeepSpeed
blocks (``optimizer: {type, params: {...}}``, ``fp16: {...}``, ``bf16: {...}``,
``zero_optimization: {...}``, ``scheduler: {...}``, ...). :func:`flatten` turns one such mapping
into *entries*, one per field (or per sub-key of a block kept whole, such as
``zero_optimization``), each remembering the key as written and its file.
Key spelling: every dash becomes an underscore, in blocks too, and a dotted key ``a.b`` is the
same as ``b`` inside block ``a`` (useful on command lines: ``fp16.enabled=true``).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from kerple.config.errors import ConfigError
from kerple.config.fields import TypeMismatch, check_bounds, check_value
from kerple.config.sections import SECTIONS

@dataclass(frozen=True)
class FieldRef:
    """One section field and the YAML keys that set it."""

    section: str
    name: str
    hint: Any
    metadata: Any

    @property
    def keys(self) -> tuple[str, ...]:
        """Accepted keys, primary first."""
        return self.metadata["keys"] or (self.name,)

    @property
    def primary(self) -> str:
        """The key written by ``Config.to_dict`` and shown in messages."""
        return self.keys[0]

    @property
    def ident(self) -> str:
        """``section.name``: the field's identity, used for provenance."""
        return f"{self.section}.{self.name}"


def _build_index() -> tuple[list[FieldRef], dict[str, FieldRef], dict[str, FieldRef]]:
    refs: list[FieldRef] = []
    index: dict[str, FieldRef] = {}
    derived: dict[str, FieldRef] = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            ref = FieldRef(section, field.name, hints[field.name], field.metadata)
            refs.append(ref)
            table = derived if field.metadata["derived"] else index
            for key in ref.keys:
                if key in index or key in derived:
                    raise RuntimeError(f"config key {key!r} is declared twice")
                table[key] = ref
    return refs, index, derived


FIELDS, KEY_INDEX, DERIVED_KEYS = _build_index()
"""Every field; accepted key -> field; derived (not settable) key -> field."""

FREE_BLOCKS: dict[str, FieldRef] = {ref.primary: ref for ref in FIELDS if ref.metadata["block"]}
"""Blocks kept as a whole mapping, merged key by key: block key -> field (``zero_optimization``, ...)."""

BLOCK_PATHS = frozenset(
    ".".join(key.split(".")[:depth]) for key in KEY_INDEX for depth in range(1, key.count(".") + 1)
)
"""Keys that hold a block of further keys: ``optimizer``, ``optimizer.params``, ``fp16``, ``bf16``."""


def normalize_key(key: str) -> str:
    """Canonical spelling of a key: dashes become underscores (``hidden-size`` -> ``hidden_size``)."""
    return key.strip().replace("-", "_")


def suggest(key: str, candidates: typing.Iterable[str]) -> str | None:
    """The closest valid key to a misspelled one (difflib), or ``None``."""
    matches = difflib.get_close_matches(key, sorted(set(candidates)), n=1, cutoff=0.6)
    return matches[0] if matches else None


def _candidates_under(parent: str) -> list[str]:
    """Valid keys directly inside block ``parent`` ("" for the top level), in full dotted form."""
    depth = 0 if not parent else parent.count(".") + 1
    pool = list(KEY_INDEX) + list(BLOCK_PATHS)
    prefix = f"{parent}." if parent else ""
    return [key for key in pool if key.startswith(prefix) and key.count(".") == depth]


@dataclass
class Entry:
    """One value from one source."""

    value: Any
    source: str  # file name, or "<command line>"
    written: str  # the key as written in that source (dotted for nested keys)


def _unknown_key(path: str, written: str, source: str) -> ConfigError:
    parent = path.rpartition(".")[0]
    if path in DERIVED_KEYS:
        ref = DERIVED_KEYS[path]
        return ConfigError(
            f"is computed from other keys ({ref.metadata['help'].rstrip('.')}) and cannot be set; remove it",
            file=source,
            key=written,
        )
    leaf = path.rpartition(".")[2]
    siblings = {key.rpartition(".")[2]: key for key in _candidates_under(parent)}
    nested = sorted(key for key in KEY_INDEX if key.rpartition(".")[2] == leaf and key != path)
    guess = suggest(leaf, siblings)
    if nested:
        hint = f"; did you mean '{nested[0]}' (inside the '{nested[0].rpartition('.')[0]}' block)?"
    elif guess is not None:
        hint = f"; did you mean '{siblings[guess]}'?"
    else:
        hint = "; see docs/config.md for the valid keys"
    where = f" in block '{parent}'" if parent else ""
    return ConfigError(f"unknown key{where}{hint}", file=source, key=written)


def _block_key(block: str, sub: str, written: str, source: str) -> str:
    """``block.sub`` (normalised), after checking ``sub`` against the keys DeepSpeed accepts there."""
    sub = normalize_key(sub)
    allowed = FREE_BLOCKS[block].metadata["block_keys"]
    if allowed is not None and sub.partition(".")[0] not in allowed:
        guess = suggest(sub, allowed)
        hint = f"; did you mean '{block}.{guess}'?" if guess else f"; DeepSpeed 0.19.8 accepts {', '.join(allowed)}"
        raise ConfigError(f"unknown key in block '{block}' (DeepSpeed would refuse it){hint}", file=source, key=written)
    return f"{block}.{sub}"


def _known_value(ref: FieldRef, value: Any, written: str, source: str) -> Any:
    """``value`` with GPT-NeoX's other spellings resolved; a GPT-NeoX value kerple lacks is refused."""
    if not isinstance(value, str):
        return value
    feature = ref.metadata["refuse_values"].get(value)
    if feature is not None:
        choices = get_args(ref.hint) if get_origin(ref.hint) is Literal else ()
        hint = f"; use one of {', '.join(map(str, choices))}" if choices else ""
        raise ConfigError(f"{value!r} selects {feature}, which is not implemented in kerple{hint}", file=source, key=written)
    return ref.metadata["value_aliases"].get(value, value)


def _checked_value(ref: FieldRef, value: Any, written: str, source: str) -> Any:
    """``value`` resolved, type-checked against the field and within its bounds, or an error naming ``source``."""
    value = _known_value(ref, value, written, source)
    try:
        checked = check_value(value, ref.hint)
    except TypeMismatch as error:
        raise ConfigError(f"wrong type: {error}", file=source, key=written) from None
    problem = check_bounds(checked, ref.metadata)
    if problem:
        raise ConfigError(f"invalid value: {problem}", file=source, key=written)
    return checked


def flatten(mapping: dict, source: str) -> dict[str, Entry]:
    """Route one source's mapping to entries keyed by field identity (``section.name``).

    Sub-keys of blocks kept whole get their own entries (``zero_optimization.<sub>``). Values
    are type-checked here so that errors can name ``source``. Two keys of one source that set
    the same field (``hidden-size`` and ``hidden_size``, or ``lr`` and ``optimizer.params.lr``)
    are an error.
    """
    entries: dict[str, Entry] = {}

    def put(ident: str, value: Any, written: str) -> None:
        if ident in entries:
            raise ConfigError(
                f"set twice in one file (also as '{entries[ident].written}'); keep one",
                file=source,
                key=written,
            )
        entries[ident] = Entry(value, source, written)

    def walk(block: dict, parent: str, written_parent: str) -> None:
        for raw_key, value in block.items():
            if not isinstance(raw_key, str):
                raise ConfigError(f"keys must be strings, got {raw_key!r}", file=source, key=written_parent or None)
            written = f"{written_parent}.{raw_key}" if written_parent else raw_key
            path = ".".join(filter(None, [parent, *(normalize_key(part) for part in raw_key.split("."))]))
            free = next((b for b in FREE_BLOCKS if path == b or path.startswith(b + ".")), None)
            if free is not None:
                if path == free:
                    if value is None:
                        continue
                    if not isinstance(value, dict):
                        raise ConfigError(f"expected a mapping, got {value!r}", file=source, key=written)
                    for sub, sub_value in value.items():
                        put(_block_key(free, str(sub), f"{written}.{sub}", source), sub_value, f"{written}.{sub}")
                else:
                    put(_block_key(free, path[len(free) + 1 :], written, source), value, written)
            elif path in KEY_INDEX:
                ref = KEY_INDEX[path]
                put(ref.ident, _checked_value(ref, value, written, source), written)
            elif path in BLOCK_PATHS:
                if not isinstance(value, dict):
                    inner = sorted(key.rpartition(".")[2] for key in _candidates_under(path))
                    raise ConfigError(
                        f"expected a mapping with keys {', '.join(inner)}, got {value!r}",
                        file=source,
                        key=written,
                    )
                walk(value, path, written)
            else:
                raise _unknown_key(path, written, source)

    if not isinstance(mapping, dict):
        raise ConfigError(f"the file must hold a mapping of keys, got {type(mapping).__name__}", file=source)
    walk(mapping, "", "")
    return entries


def field_default(ref: FieldRef) -> Any:
    """The default value of a field (a fresh copy for lists and dicts)."""
    field = next(f for f in dataclasses.fields(SECTIONS[ref.section]) if f.name == ref.name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def key_of(ident: str) -> str:
    """The primary key of a field identity (``model.hidden_size`` -> ``hidden_size``)."""
    if ident.startswith(tuple(f"{b}." for b in FREE_BLOCKS)):
        return ident
    section, _, name = ident.partition(".")
    ref = next(r for r in FIELDS if r.section == section and r.name == name)
    return ref.primary
