"""Progress bars that suit where stderr goes.

On a terminal, :func:`progress_bar` is tqdm's bar, redrawn in place. Anywhere else (a pipe, a log
file, a CI console) a bar redrawn with carriage returns leaves cursor codes and one very long line,
so the same bar is printed as plain lines instead: nothing for the first
:data:`PLAIN_INTERVAL` seconds (short loops stay silent), then one line at most every
:data:`PLAIN_INTERVAL` seconds with the count, elapsed time, estimate and rate, and a last line
when a bar that is kept (``leave=True``) closes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TextIO

from tqdm import tqdm

PLAIN_INTERVAL = 10.0
"""Seconds before the first plain line, and between two."""

PLAIN_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
PLAIN_FORMAT_OPEN = "{desc}: {n_fmt} [{elapsed}, {rate_fmt}{postfix}]"


class _PlainLines:
    """A stream for tqdm that turns each carriage-return redraw into one line on ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._last = ""

    def write(self, text: str) -> int:
        for piece in text.split("\r"):
            piece = piece.rstrip()
            count = piece.split(" [", 1)[0]
            if piece and count != self._last:  # tqdm redraws the last count when it closes
                self._stream.write(piece + "\n")
                self._last = count
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


def progress_bar(iterable: Iterable[Any] | None = None, **options: Any) -> tqdm:
    """``tqdm(iterable, **options)`` on stderr: the usual bar on a terminal, plain lines elsewhere
    (``disable=True`` turns it off; ``disable=None``, tqdm's "only on a terminal", shows plain lines
    off one)."""
    stream = sys.stderr
    if options.get("disable") is True or stream.isatty():
        return tqdm(iterable, file=stream, **options)
    options.pop("dynamic_ncols", None)
    total = options.get("total", len(iterable) if hasattr(iterable, "__len__") else None)  # type: ignore[arg-type]
    options.update(disable=False, ascii=True, bar_format=PLAIN_FORMAT if total else PLAIN_FORMAT_OPEN)
    options.setdefault("mininterval", PLAIN_INTERVAL)
    options.setdefault("delay", PLAIN_INTERVAL)
    return tqdm(iterable, file=_PlainLines(stream), **options)
