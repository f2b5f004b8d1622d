"""Progress for long commands, on a terminal and in a log file alike.

On a terminal :func:`progress` gives a tqdm bar. When stderr is piped or redirected (a job
scheduler's log, ``2>&1 | tee``), tqdm's bar would either switch itself off (``disable=None``) or
fill the log with carriage returns; there a :class:`LineProgress` writes one plain line every
``interval`` seconds instead (count, elapsed time, rate and the caller's postfix, e.g. tokens/s),
and a last line when the work ends. Both offer the subset of tqdm's interface the commands use:
``update``, ``set_postfix_str``, ``close`` and use as a context manager.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

PLAIN_INTERVAL_S = 10.0
"""Seconds between two plain progress lines."""


class LineProgress:
    """Plain progress lines (no cursor control), at most one per ``interval`` seconds."""

    def __init__(self, desc: str, unit: str, total: int | None = None, file: TextIO | None = None,
                 interval: float | None = None) -> None:
        self.desc, self.unit, self.total = desc, unit, total
        self.file = file if file is not None else sys.stderr
        self.interval = PLAIN_INTERVAL_S if interval is None else interval
        self.count = 0
        self.postfix = ""
        self.started = self.last_line = time.monotonic()
        self.closed = False

    def line(self) -> str:
        """The current state in one line: ``desc: 1,200/5,000 doc in 10s (120 doc/s), postfix``."""
        elapsed = time.monotonic() - self.started
        of_total = f"/{self.total:,}" if self.total else ""
        rate = f" ({self.count / elapsed:,.0f} {self.unit}/s)" if elapsed > 0 else ""
        postfix = f", {self.postfix}" if self.postfix else ""
        return f"{self.desc}: {self.count:,}{of_total} {self.unit} in {elapsed:,.1f}s{rate}{postfix}"

    def update(self, count: int = 1) -> None:
        """Add ``count`` done; print a line when ``interval`` seconds passed since the last one."""
        self.count += count
        now = time.monotonic()
        if now - self.last_line >= self.interval:
            self.last_line = now
            print(self.line(), file=self.file, flush=True)

    def set_postfix_str(self, postfix: str) -> None:
        """Text appended to the next lines (e.g. ``"1,234 tok/s"``)."""
        self.postfix = postfix

    def close(self) -> None:
        """Print the final line (once, and only when something was done)."""
        if not self.closed and self.count:
            print(self.line(), file=self.file, flush=True)
        self.closed = True

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if kind is None:
            self.close()
        self.closed = True  # a failing command ends with its error line, not a progress line


def progress(desc: str, unit: str, total: int | None = None, enabled: bool = True,
             file: TextIO | None = None, interval: float | None = None, **tqdm_options: Any) -> Any:
    """A tqdm bar on a terminal, :class:`LineProgress` elsewhere, a disabled bar when not
    ``enabled`` (``--quiet``). ``tqdm_options`` go to tqdm only (``unit_scale``, ``leave``)."""
    from tqdm import tqdm

    stream = file if file is not None else sys.stderr
    if enabled and not getattr(stream, "isatty", lambda: False)():
        return LineProgress(desc, unit, total, stream, interval)
    return tqdm(total=total, desc=desc, unit=unit, file=stream, disable=not enabled, dynamic_ncols=True,
                **tqdm_options)
