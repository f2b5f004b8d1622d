"""The errors of a training run: why it cannot start or had to stop, and what to change."""

from __future__ import annotations

from kerple.errors import KerpleError


class TrainingError(KerpleError):
    """A run that cannot start or must stop; the message says why and what to change."""


class TrainingDivergedError(TrainingError):
    """The loss became NaN or infinite; nothing was saved for that step."""
