"""Errors of the checkpoint reader, writer and converters.

Every message names the file or key at fault and what to do about it. Entry points print the
message and exit with status 2 (as for :class:`kerple.config.ConfigError`).
"""

from __future__ import annotations

from kerple.errors import KerpleError


class CheckpointError(KerpleError, RuntimeError):
    """A checkpoint cannot be read, converted or written; the message names the path and the fix."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle needs a global outside the allowlist (it could run code when loaded).

    ``offending`` lists the fully qualified names of the globals that were refused.
    """

    def __init__(self, message: str, offending: list[str] | None = None) -> None:
        super().__init__(message)
        self.offending = list(offending or [])


class ArchitectureMismatchError(CheckpointError):
    """The checkpoint's architecture differs from the config's; ``fields`` names every difference."""

    def __init__(self, message: str, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.fields = list(fields or [])


class ModelParallelError(CheckpointError):
    """Model-parallel shards are missing, inconsistent, or cannot be split to the requested size."""
