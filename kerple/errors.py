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
import sys
from collections.abc import Callable
from typing import ParamSpec

USER_ERROR_STATUS = 2
"""Exit status of an entry point that stopped on a :class:`KerpleError` (as argparse's usage errors)."""

_Params = ParamSpec("_Params")

class KerpleError(Exception):
    """A problem with the user's input; entry points print its message without a traceback."""


def entry_point(prog: str) -> Callable[[Callable[_Params, int]], Callable[_Params, int]]:
    """Decorate the ``main`` of the command ``prog``: a :class:`KerpleError` becomes the line
    ``prog: error: message`` on stderr and the return value :data:`USER_ERROR_STATUS`."""

    def decorate(main: Callable[_Params, int]) -> Callable[_Params, int]:
        @functools.wraps(main)
        def run(*args: _Params.args, **kwargs: _Params.kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except KerpleError as error:
                print(f"{prog}: error: {error}", file=sys.stderr)
                return USER_ERROR_STATUS

        return run

    return decorate
