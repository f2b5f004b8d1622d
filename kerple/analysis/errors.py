"""Errors of ``analyze.py``."""

from __future__ import annotations

from kerple.errors import KerpleError


class AnalysisError(KerpleError):
    """A bad ``analyze.py`` input: no checkpoint, a length the model cannot take, a temperature outside (0, 1]."""
