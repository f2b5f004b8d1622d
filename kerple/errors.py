"""The base class of the project's own errors, and how entry points report them.

Every error a user fixes by changing an input (a config key, a data or checkpoint file, a
command-line argument) derives from :class:`KerpleError`, and its message names the file, key or
argument at fault and the fix. An entry point decorated with :func:`entry_point` prints such an
error as one line, ``prog: error: message``, and returns exit status 2; any other exception is a
bug and propagates with its traceback. This module imports nothing heavy, so every package can
derive its errors from it.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ParamSpec

USER_ERROR_STATUS = 2
"""Exit status of an entry point that stopped on a :class:`KerpleError` (as argparse's usage errors)."""

INTERRUPTED_STATUS = 130
"""Exit status of an entry point stopped by Ctrl-C (128 + SIGINT, what a shell reports for a process
that SIGINT ended): a script can tell an interrupted run from a finished one (0)."""

_Params = ParamSpec("_Params")

FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT})
"""``errno`` values of a write the disk (or the user's quota) had no room for."""


def full_disk_message(error: OSError) -> str:
    """One line for a write that found the disk full: what could not be written and the fix."""
    where = f" writing {error.filename}" if error.filename else ""
    return (f"{error.strerror or 'no space left on device'}{where}: free disk space, or choose a folder on "
            "another disk, then run the same command again")

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


def did_you_mean(name: object, choices: Sequence[str]) -> str:
    """``"did you mean 'kerple_log'? "`` for the choice closest to an unknown ``name``, else ``""``
    (the start of a refusal's hint)."""
    guess = difflib.get_close_matches(str(name), list(choices), n=1)
    return f"did you mean {guess[0]!r}? " if guess else ""


@contextlib.contextmanager
def quiet_log(name: str = "kerple.config") -> Iterator[None]:
    """Within the block, the logger ``name`` and its children show warnings only (a config loaded
    for the command's own use: its overrides are no news to the user)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def entry_point(prog: str) -> Callable[[Callable[_Params, int]], Callable[_Params, int]]:
    """Decorate the ``main`` of the command ``prog``: a :class:`KerpleError` becomes the line
    ``prog: error: message`` on stderr and the return value :data:`USER_ERROR_STATUS`; a Ctrl-C
    (``KeyboardInterrupt``) the line ``prog: interrupted`` and :data:`INTERRUPTED_STATUS`, with no
    traceback; a write that found the disk full (``ENOSPC``, ``EDQUOT``) one line naming the file,
    and :data:`USER_ERROR_STATUS` (the writers remove their partial files: :mod:`kerple.atomic`).
    The project's log lines are shown (:func:`show_project_log`)."""

    def decorate(main: Callable[_Params, int]) -> Callable[_Params, int]:
        @functools.wraps(main)
        def run(*args: _Params.args, **kwargs: _Params.kwargs) -> int:
            show_project_log()
            try:
                return main(*args, **kwargs)
            except KerpleError as error:
                print(f"{prog}: error: {error}", file=sys.stderr)
                return USER_ERROR_STATUS
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return INTERRUPTED_STATUS
            except OSError as error:
                if error.errno not in FULL_DISK:
                    raise
                print(f"{prog}: error: {full_disk_message(error)}", file=sys.stderr)
                return USER_ERROR_STATUS

        return run

    return decorate


@contextlib.contextmanager
def exit_on_interrupt(prog: str) -> Iterator[None]:
    """While modules load and the config is read (the command has written nothing yet), Ctrl-C ends
    the process at once with ``prog: interrupted`` and :data:`INTERRUPTED_STATUS`. A
    ``KeyboardInterrupt`` raised inside an import can be swallowed by a library's bare ``except:``
    (train.py then trained on) or leave a module half-loaded (numpy's lazy import then recursed into
    a ``RecursionError`` traceback). Outside the main thread it does nothing."""

    def stop(_signum: int, _frame: Any) -> None:
        sys.stdout.flush()
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        os._exit(INTERRUPTED_STATUS)

    with _sigint_handler(stop):
        yield


@contextlib.contextmanager
def _sigint_handler(handler: Any) -> Iterator[None]:
    """``handler`` for SIGINT inside the block, the previous one restored after; outside the main thread
    (where Python cannot set handlers) nothing changes."""
    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def load_modules(prog: str, *names: str) -> None:
    """Import ``names`` under :func:`exit_on_interrupt`: a command that imports torch lazily, in the
    middle of its ``main``, loads it first where Ctrl-C ends the process at once (a Ctrl-C inside
    torch's import was swallowed by a library, or left numpy half-loaded and ended in an ImportError)."""
    import importlib

    with exit_on_interrupt(prog):
        for name in names:
            importlib.import_module(name)


@contextlib.contextmanager
def children_ignore_interrupt() -> Iterator[None]:
    """Child processes started inside ignore Ctrl-C (a process inherits an ignored SIGINT, and Python
    keeps it ignored): the terminal's Ctrl-C reaches the whole process group, and a worker that
    died of it printed its own traceback and could leave its parent waiting for a result forever.
    The parent alone stops, and ends its workers. A Ctrl-C while the children are being started
    (milliseconds) is lost. Outside the main thread it does nothing."""
    with _sigint_handler(signal.SIG_IGN):
        yield


def future_result(future: Any) -> Any:
    """The result of a ``concurrent.futures`` future or a ``multiprocessing`` ``AsyncResult``, waited
    for in short slices: a wait without a timeout is not interrupted by Ctrl-C when the signal reaches
    another thread, and the command would wait for its workers forever."""
    import concurrent.futures

    if hasattr(future, "ready"):  # multiprocessing.pool.AsyncResult
        while not future.ready():
            future.wait(0.2)
        return future.get()
    while not future.done():
        concurrent.futures.wait([future], timeout=0.2)
    return future.result()
