"""Progress bars that suit where stderr goes.

On a terminal, :func:`progress_bar` is tqdm's bar, redrawn in place. Anywhere else (a pipe, a log
file, a CI console) a bar redrawn with carriage returns leaves cursor codes and one very long line,
so the same bar is printed as plain lines instead: nothing for the first
:data:`PLAIN_INTERVAL` seconds (short loops stay silent), then one line at most every
:data:`PLAIN_INTERVAL` seconds with the count, elapsed time, estimate and rate, and a last line
when a bar that is kept (``leave=True``) closes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from tqdm import tqdm

PLAIN_INTERVAL = 10.0
"""Seconds before the first plain line, and between two."""

PLAIN_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
PLAIN_FORMAT_OPEN = "{desc}: {n_fmt} [{elapsed}, {rate_fmt}{postfix}]"
PLAIN_FORMAT_SHARE = "{desc}: {percentage:3.0f}% [{elapsed}<{remaining}{postfix}]"
"""For a total that is not a count (evaluate.py's overall bar counts estimated seconds)."""
_CURSOR_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
"""tqdm moves the cursor up (ESC [ A) to redraw a bar below another."""


class _PlainLines:
    """A stream for tqdm that turns each carriage-return redraw into one line on ``stream``."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._last = ""

    def write(self, text: str) -> int:
        for piece in _CURSOR_CODES.sub("", text).split("\r"):
            piece = piece.rstrip()
            count = piece.split(" [", 1)[0]
            if piece and count != self._last:  # tqdm redraws the last count when it closes
                self._stream.write(piece + "\n")
                self._last = count
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


class _PlainBar(tqdm):
    """tqdm whose postfix and description changes wait for the next timed line (tqdm redraws at once
    on ``set_postfix``, which off a terminal printed a line per batch)."""

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        super().set_postfix_str(s, refresh=False)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        super().set_description(desc, refresh=False)


def progress_bar(iterable: Iterable[Any] | None = None, **options: Any) -> tqdm:
    """``tqdm(iterable, **options)`` on stderr: the usual bar on a terminal, plain lines elsewhere
    (``disable=True`` turns it off; ``disable=None``, tqdm's "only on a terminal", shows plain lines
    off one). Off a terminal a total that is not a whole number is shown as a percentage."""
    stream = sys.stderr
    if options.get("disable") is True or stream.isatty():
        return tqdm(iterable, file=stream, **options)
    options.pop("dynamic_ncols", None)
    total = options.get("total", len(iterable) if hasattr(iterable, "__len__") else None)  # type: ignore[arg-type]
    counted = total is None or float(total).is_integer()
    options.update(disable=False, ascii=True,
                   bar_format=PLAIN_FORMAT_OPEN if not total else PLAIN_FORMAT if counted else PLAIN_FORMAT_SHARE)
    options.setdefault("mininterval", PLAIN_INTERVAL)
    options.setdefault("delay", PLAIN_INTERVAL)
    return _PlainBar(iterable, file=_PlainLines(stream), **options)
