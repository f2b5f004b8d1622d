"""The errors of `kerple.evaluation`: every message says what cannot run and what to change."""

from __future__ import annotations

from kerple.errors import KerpleError


class EvaluationError(KerpleError):
    """The evaluation cannot run as asked (memory, lengths, data, results files)."""


class ProtocolError(EvaluationError):
    """A protocol cannot be laid out on the stream with the requested settings."""
