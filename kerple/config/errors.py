"""The one exception type of the config system."""

from __future__ import annotations

from kerple.errors import KerpleError

COMMAND_LINE = "<command line>"
"""Source label of values that came from ``key=value`` overrides."""

THIS_COMMAND = "<this command>"
"""Source label of values a command fixes for its own purpose (evaluation: ``train_iters: 0``)."""

DEFAULT = "<default>"
"""Source label of values nobody set (the dataclass default)."""

SOURCES_COMMENT = "# kerple sources: "
"""First line of a resolved config that records each value's file and key (JSON after it): a
command reading that file reports the user's files, not the resolved one."""


class ConfigError(KerpleError, ValueError):
    """A configuration that cannot be used, with the file and the key at fault.

    ``str(error)`` reads ``"<file>: key '<key>': <message>"``; entry points print it and exit with
    status 2 (:func:`kerple.errors.entry_point`). ``file`` may list several files when the problem
    is a combination of keys set in different places.
    """

    def __init__(self, message: str, *, file: str | None = None, key: str | tuple[str, ...] | None = None) -> None:
        self.message = message
        self.file = file
        self.key = key
        parts = [file] if file else []
        if isinstance(key, tuple):
            parts.append("keys " + " and ".join(f"'{name}'" for name in key))
        elif key:
            parts.append(f"key '{key}'")
        parts.append(message)
        super().__init__(": ".join(parts))
