"""The one way the jobs run a child process (prepare_data.py, train.py, evaluate.py, analyze.py, a GPU check step).

Child processes, because a training stops cleanly only through its own signal handler (``SIGTERM``:
finish the step, save, exit 0), a crash or a hung compilation ends the child and not the job, and each
stage starts with an empty GPU. With ``session=False`` (the demos) the terminal's Ctrl-C reaches the
child too; it exits 130 and :meth:`Outcome.check` raises ``KeyboardInterrupt`` here. With
``session=True`` this process decides what reaches the child: a :class:`StopRequest` or the deadline
sends it ``stop_signal`` (``None``: the deadline kills at once); ``grace`` seconds later, or on a second
request, its whole group is killed, as when this process leaves on an exception (Ctrl-C).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerple.errors import KerpleError

REPO = Path(__file__).resolve().parents[2]
TAIL_LINES = 40
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ChildFailed(KerpleError):
    """A child exited with a non-zero status; the message ends with its own last line."""


class StopRequest:
    """Counts the stop signals this command received (``install`` makes SIGINT/SIGTERM/SIGHUP count)."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.count > 0

    def install(self) -> None:
        for signum in HANDLED_SIGNALS:
            self._previous[signum] = signal.signal(signum, lambda *_: setattr(self, "count", self.count + 1))

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


@dataclass
class Outcome:
    """How a child ended: exit status (negative: the signal that ended it), wall seconds, whether it
    was asked to stop (``"deadline"`` or ``"signal"``) or killed, and its last lines."""

    returncode: int
    seconds: float
    stopped: str | None = None
    killed: bool = False
    tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def interrupted(self) -> bool:
        """Ended by the Ctrl-C that also reached this process (status 130, or SIGINT itself)."""
        return self.returncode in (130, -signal.SIGINT)

    def last_line(self, default: str = "(no output)") -> str:
        return next((line.strip() for line in reversed(self.tail) if line.strip()), default)

    def check(self, what: str) -> None:
        """Raise ``KeyboardInterrupt`` for an interrupted child and :class:`ChildFailed` (``what exited
        with status N: its last line``) for a failed one; the lines before a last line that is not a
        one-line refusal (a crash's traceback) are printed on stderr first."""
        if self.interrupted:
            raise KeyboardInterrupt
        if not self.ok:
            last = self.last_line("(its output is above)" if not self.tail else "(no output)")
            if ": error: " not in last and self.tail:
                print("\n".join(line for line in self.tail[-30:] if line.strip()), file=sys.stderr)
            raise ChildFailed(f"{what} exited with status {self.returncode}: {last}")


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _reader(process: subprocess.Popen, log_path: Path | None, tail: deque[str],
            on_line: Callable[[str], None] | None) -> threading.Thread:
    """A thread copying the child's output to the log file, ``tail`` and ``on_line``."""
    def read() -> None:
        with open(log_path or os.devnull, "a", encoding="utf-8") as log:
            log.write(f"\n$ {' '.join(map(str, process.args))}  # {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            for raw in process.stdout:
                log.write(raw)
                log.flush()
                tail.append(raw.rstrip("\n"))
                if on_line:
                    on_line(raw.rstrip("\n"))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def run_child(
    command: Sequence[Any], *, log_path: Path | None = None, on_line: Callable[[str], None] | None = None,
    capture: bool | None = None, stop: StopRequest | None = None, deadline: float | None = None, margin: float = 0.0,
    grace: float = 60.0, stop_signal: int | None = signal.SIGTERM, session: bool = True,
    on_tick: Callable[[], None] | None = None, env: dict[str, str] | None = None,
) -> Outcome:
    """Run ``command`` until it exits. Its output (stderr merged) goes to ``log_path`` and ``on_line``
    when either is given, or ``capture`` is true (kept in the tail only), else to this process's
    stdout. At ``deadline - margin`` (a ``time.monotonic()`` value) or on a ``stop`` request the child
    gets ``stop_signal``, and ``grace`` seconds later its group is killed. ``on_tick`` runs every
    0.1 s while it runs (the progress a job reads from the run's files)."""
    if log_path:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    piped = bool(log_path or on_line or capture)
    started, tail = time.monotonic(), deque(maxlen=TAIL_LINES)
    process = subprocess.Popen(list(map(str, command)), stdout=subprocess.PIPE if piped else None,
                               stderr=subprocess.STDOUT if piped else None, text=True, bufsize=1, errors="replace",
                               env=env, cwd=REPO, start_new_session=session)
    reader = _reader(process, log_path, tail, on_line) if piped else None
    outcome, asked_at = Outcome(returncode=0, seconds=0.0), None
    try:
        while process.poll() is None:
            now = time.monotonic()
            requested = stop is not None and stop.requested
            if asked_at is None and (requested or (deadline is not None and now >= deadline - margin)):
                outcome.stopped, asked_at = "signal" if requested else "deadline", now
                if stop_signal is not None:
                    process.send_signal(stop_signal)
            if asked_at is not None and (stop_signal is None or now - asked_at > grace or (stop is not None and stop.count > 1)):
                _kill_group(process)
                outcome.killed = True
                process.wait()
                break
            if on_tick:
                on_tick()
            time.sleep(0.1)
    finally:
        if process.poll() is None:  # this process is leaving (an exception): leave nothing behind
            if session:
                _kill_group(process)
            process.wait()
        if reader:
            reader.join(timeout=10)
    if on_tick:
        on_tick()
    outcome.returncode, outcome.seconds, outcome.tail = process.returncode, time.monotonic() - started, list(tail)
    return outcome


def child_environment(cuda: bool, threads: int | None = None) -> dict[str, str]:
    """The children's environment: this checkout's kerple, DeepSpeed on the right accelerator (no GPU
    visible to a CPU run), offline, each a single rank of its own; ``threads`` per child when given."""
    env = {**os.environ, "DS_ACCELERATOR": "cuda" if cuda else "cpu", "TOKENIZERS_PARALLELISM": "false"}
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        env.setdefault(key, "1")
    env.setdefault("WANDB_MODE", "offline")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env
