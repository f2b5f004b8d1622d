"""The error of `kerple.reproduce`: a reproduction that cannot run as asked, with what to change."""

from __future__ import annotations

from kerple.errors import KerpleError


class ReproduceError(KerpleError):
    """Bad options, a work folder started with other settings, or no GPU for the full scale."""
