"""Reading YAML files, merging them in order, and command-line overrides.

Merge rule (the one rule, for every key): files are read in the order given and **a later file
wins**, whether either file spells the key with dashes or underscores; command-line overrides
come after the last file. Each replaced value is logged on the ``kerple.config`` logger as
``key: old (file a) -> new (file b)``. Within one file (or one set of overrides) a key may appear
only once, in any spelling: ``hidden-size`` next to ``hidden_size`` is an error, as is ``lr`` next
to ``optimizer.params.lr``. DeepSpeed blocks (``optimizer``, ``fp16``, ``bf16``,
``zero_optimization``, ``scheduler``, ...) merge key by key, so a later ``fp16: {enabled: false}``
keeps the earlier loss-scale settings.

GPT-NeoX keys that kerple reads without acting on them are listed, once per load, in one note on
the same logger (:func:`kerple.config.neox_checks.compatibility_note`); entry points print it.
``deepy.py`` prints them when it merges the user's files and names the resolved file it wrote in
:data:`NOTES_SHOWN`, so the ranks it starts on that file do not print them again.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kerple.cli import split_arguments  # noqa: F401 - re-exported: kerple.config.split_arguments
from kerple.config.config import Config
from kerple.config.errors import COMMAND_LINE, DEFAULT, SOURCES_COMMENT, THIS_COMMAND, ConfigError
from kerple.config.neox_checks import compatibility_note, unused_data_path_note
from kerple.config.neox_keys import FREE_BLOCKS, KEY_INDEX, Entry, flatten, key_of, normalize_key
from kerple.config.sections import SECTIONS

logger = logging.getLogger("kerple.config")

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
NOTES_SHOWN = "KERPLE_CONFIG_NOTES_SHOWN"
"""Environment variable: the config file whose notes a launcher already printed."""


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first_line: int, line: int) -> None:
        super().__init__(key)
        self.key, self.first_line, self.line = key, first_line, line


class ConfigYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects duplicate keys, reads ``1e-8`` as a float (YAML 1.1 wants
    ``1.0e-8``) and leaves dates as strings."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first_lines:
                    raise _DuplicateKey(key, first_lines[key], line)
                first_lines[key] = line
            except TypeError:  # unhashable key: let PyYAML report it
                continue
        return super().construct_mapping(node, deep=deep)


ConfigYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text`` with :class:`ConfigYamlLoader`; errors become :class:`ConfigError`."""
    try:
        return yaml.load(text, Loader=ConfigYamlLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as duplicate:
        raise ConfigError(
            f"appears twice (lines {duplicate.first_line} and {duplicate.line}); keep one",
            file=source,
            key=str(duplicate.key),
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"not valid YAML: {yaml_problem(error)}", file=source) from None


def yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: the problem and where (line, column)."""
    mark = getattr(error, "problem_mark", None)
    problem = " ".join(str(getattr(error, "problem", None) or error).split())
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{problem}{where}"


def read_yaml(path: str | os.PathLike) -> dict:
    """The top-level mapping of one YAML file (an empty file is ``{}``)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        if not Path(path).exists() and normalize_key(source) in KEY_INDEX:  # `train_iters` meant as an override
            raise ConfigError(f"an override needs a value (no file has this name): write {source}=VALUE",
                              file=COMMAND_LINE, key=source) from None
        raise ConfigError(f"cannot read the file: {error.strerror or error}", file=source) from None
    except UnicodeDecodeError as error:
        line = Path(path).read_bytes()[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"not UTF-8 text: byte 0x{error.object[error.start]:02x} on line {line} cannot be decoded; "
            "save the file as UTF-8",
            file=source,
        ) from None
    data = parse_yaml(text, source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"the file must hold a mapping of keys, got {type(data).__name__}", file=source)
    return data


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are typed as YAML scalars (``lr=1e-4`` is a float,
    ``use_wandb=false`` a bool, ``betas=[0.9,0.95]`` a list, ``key=`` null). Dotted keys
    address DeepSpeed blocks (``fp16.enabled=true``). A key given twice is an error."""
    overrides: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("expected key=value", file=COMMAND_LINE, key=item)
        spelling = ".".join(normalize_key(part) for part in key.split("."))
        if spelling in seen:
            raise ConfigError(f"given twice (also as '{seen[spelling]}'); keep one", file=COMMAND_LINE, key=key)
        seen[spelling] = key
        try:
            overrides[key] = parse_yaml(text, COMMAND_LINE) if text.strip() else None
        except ConfigError:
            raise ConfigError(f"value {text!r} is not valid YAML; quote a string (key='\"text\"'), or write "
                              "a number, true/false, or a list [a, b]", file=COMMAND_LINE, key=key) from None
    return overrides


def _merge_into(merged: dict[str, Entry], entries: Mapping[str, Entry], log: bool = True) -> None:
    for ident, entry in entries.items():
        previous = merged.get(ident)
        if log and previous is not None and previous.value != entry.value:
            logger.info(
                "%s: %r (%s) -> %r (%s)", key_of(ident), previous.value, previous.source, entry.value, entry.source
            )
        merged[ident] = entry


def build_config(merged: Mapping[str, Entry]) -> Config:
    """A :class:`Config` from merged entries (field identity -> value and source)."""
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    free: dict[str, dict[str, Any]] = {block: {} for block in FREE_BLOCKS}
    for ident, entry in merged.items():
        head, _, rest = ident.partition(".")
        if head in free:
            free[head][rest] = entry.value
        else:
            values[head][rest] = entry.value
    for block, ref in FREE_BLOCKS.items():
        values[ref.section][ref.name] = free[block]
    sections = {section: cls(**values[section]) for section, cls in SECTIONS.items()}
    sources = {ident: (entry.source, entry.written) for ident, entry in merged.items()}
    return Config(**sections, sources=sources)


def load_config(
    paths: Sequence[str | os.PathLike],
    overrides: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> Config:
    """Load, merge (later file wins; see the module docstring), derive and validate a config.

    Args:
        paths: YAML files, merged in order.
        overrides: ``{key: value}`` applied after the last file, e.g. from
            :func:`parse_overrides`; keys may be dashed, underscored or dotted.
        fixed: values the calling command sets for its own purpose (evaluation sets
            ``train_iters: 0``), applied last and not logged as overrides; their source is
            ``<this command>``.

    Raises:
        ConfigError: naming the file and key of the first problem found.
    """
    merged: dict[str, Entry] = {}
    for path in paths:
        entries = flatten(read_yaml(path), str(path))
        _merge_into(merged, _recorded_sources(path, entries))
    if overrides:
        _merge_into(merged, flatten(dict(overrides), COMMAND_LINE))
    if fixed:
        _merge_into(merged, flatten(dict(fixed), THIS_COMMAND), log=False)
    cfg = build_config(merged)
    shown = os.environ.get(NOTES_SHOWN)
    if not (shown and [str(path) for path in paths] == [shown]):
        for note in (compatibility_note(cfg), unused_data_path_note(cfg)):
            if note:
                logger.info("%s", note)
    return cfg


def _recorded_sources(path: str | os.PathLike, entries: dict[str, Entry]) -> dict[str, Entry]:
    """``entries`` of ``path`` with the sources its first line records (a resolved config written by
    ``Config.save_yaml(sources=True)``); a value the record does not name was a default."""
    with open(path, encoding="utf-8") as stream:
        first = stream.readline()
    if not first.startswith(SOURCES_COMMENT):
        return entries
    try:
        recorded = json.loads(first[len(SOURCES_COMMENT):])
    except ValueError:
        return entries
    restored = {}
    for ident, entry in entries.items():
        source, written = recorded.get(ident, (DEFAULT, key_of(ident)))
        restored[ident] = Entry(entry.value, str(source), str(written))
    return restored
