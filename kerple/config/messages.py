"""Messages of config errors: where a key was set, and the registry entry a config names.

Shared by :mod:`kerple.config.validate` and :mod:`kerple.config.neox_checks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kerple import positional as positional_registry
from kerple.config.errors import ConfigError

if TYPE_CHECKING:
    from kerple.config.config import Config


def where(cfg: Config, *idents: str) -> tuple[str, str | tuple[str, ...]]:
    """The file(s) and key(s) that set the given fields, for a :class:`ConfigError`."""
    files: list[str] = []
    keys: list[str] = []
    for ident in idents:
        file, key = cfg.provenance(ident)
        if file not in files:
            files.append(file)
        keys.append(key)
    return ", ".join(files), (keys[0] if len(keys) == 1 else tuple(keys))


def fail(cfg: Config, message: str, *idents: str) -> ConfigError:
    """A :class:`ConfigError` naming where ``idents`` were set."""
    file, key = where(cfg, *idents)
    return ConfigError(message, file=file, key=key)


def described(cfg: Config, ident: str, value: Any) -> str:
    """``key=value (file)`` for messages about combinations."""
    file, key = cfg.provenance(ident)
    return f"{key}={value!r} ({file})"


def positional_family(cfg: Config) -> Any:
    """``kerple.positional.family`` of the configured (canonical) ``pos_emb``."""
    return positional_registry.family(cfg.positional.pos_emb)
