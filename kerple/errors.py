"""The base class of the project's own errors, and how entry points report them.

Every error a user fixes by changing an input (a config key, a data or checkpoint file, a
command-line argument) derives from :class:`KerpleError`, and its message names the file, key or
argument at fault and the fix. An entry point decorated with :func:`entry_point` prints such an
error as one line, ``prog: error: message``, and returns exit status 2; any other exception is a
bug and propagates with its traceback. This module imports nothing heavy, so every package can
derive its errors from it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import ParamSpec

USER_ERROR_STATUS = 2
"""Exit status of an entry point that stopped on a :class:`KerpleError` (as argparse's usage errors)."""

_Params = ParamSpec("_Params")

class KerpleError(Exception):
    """A problem with the user's input; entry points print its message without a traceback."""


class UsageError(KerpleError):
    """A command-line argument that cannot be used as given (a count below one, a file where a
    folder is needed, a path no one can write); reported as one line, like argparse's own errors."""


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record is emitted (not when the
    handler was made), so redirected or captured stderr receives the project's log lines."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201 - logging's own attribute
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass

    def filter(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        return os.environ.get("RANK", "0") == "0" and bool(super().filter(record))


def show_project_log() -> None:
    """Print the ``kerple`` loggers' INFO lines (config overrides, the note on GPT-NeoX keys without
    effect) on stderr, from the first rank only; idempotent."""
    root = logging.getLogger("kerple")
    if any(isinstance(handler, _CurrentStderr) for handler in root.handlers):
        return
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def entry_point(prog: str) -> Callable[[Callable[_Params, int]], Callable[_Params, int]]:
    """Decorate the ``main`` of the command ``prog``: a :class:`KerpleError` becomes the line
    ``prog: error: message`` on stderr and the return value :data:`USER_ERROR_STATUS`. The
    project's log lines are shown (:func:`show_project_log`)."""

    def decorate(main: Callable[_Params, int]) -> Callable[_Params, int]:
        @functools.wraps(main)
        def run(*args: _Params.args, **kwargs: _Params.kwargs) -> int:
            show_project_log()
            try:
                return main(*args, **kwargs)
            except KerpleError as error:
                print(f"{prog}: error: {error}", file=sys.stderr)
                return USER_ERROR_STATUS

        return run

    return decorate
