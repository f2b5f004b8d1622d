"""Child processes with a deadline: every stage of a reproduction runs one of the project's entry points.

Why child processes rather than calls in this process: a training stops cleanly only through its
own signal handler (``SIGTERM``: finish the step, write a checkpoint, exit 0), which a call in this
process could not receive separately; a crash, an out-of-memory error or a hung compilation ends
the child, never the command; and each stage starts with an empty GPU. The child runs in its own
session, so this process decides what reaches it: a stop (the chunk's deadline, or a signal to
this command) sends ``SIGTERM`` to the child alone; if it has not exited ``grace`` seconds later,
or a second signal arrives, its whole process group is killed. Its output goes to a log file and,
line by line, to ``on_line``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerple.reproduce.plan import REPO

TAIL_LINES = 40
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequest:
    """Counts the stop signals this command received (``install`` makes SIGINT/SIGTERM/SIGHUP count)."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.count > 0

    def _handle(self, signum: int, _frame: Any) -> None:
        self.count += 1

    def install(self) -> None:
        for signum in HANDLED_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

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


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_child(
    command: Sequence[str], *, log_path: Path, stop: StopRequest, deadline: float | None = None,
    margin: float = 0.0, grace: float = 60.0, on_line: Callable[[str], None] = lambda line: None,
    env: dict[str, str] | None = None, cwd: Path | None = None,
) -> Outcome:
    """Run ``command`` until it exits; ask it to stop (SIGTERM) at ``deadline - margin`` (a
    ``time.monotonic()`` value) or on a stop request, and kill its group ``grace`` s after asking."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n$ {' '.join(map(str, command))}  # {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        log.flush()
        process = subprocess.Popen(list(map(str, command)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, bufsize=1, errors="replace", env=env, cwd=cwd, start_new_session=True)

        def read() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                log.write(raw)
                log.flush()
                tail.append(raw.rstrip("\n"))
                on_line(raw.rstrip("\n"))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        outcome = Outcome(returncode=0, seconds=0.0)
        asked_at: float | None = None
        try:
            while process.poll() is None:
                now = time.monotonic()
                if asked_at is None and (stop.requested or (deadline is not None and now >= deadline - margin)):
                    outcome.stopped = "signal" if stop.requested else "deadline"
                    process.send_signal(signal.SIGTERM)
                    asked_at = now
                elif asked_at is not None and (now - asked_at > grace or stop.count > 1):
                    _kill_group(process)
                    outcome.killed = True
                    process.wait()
                    break
                time.sleep(0.1)
        finally:
            if process.poll() is None:  # this process is leaving (an exception): leave nothing behind
                _kill_group(process)
                process.wait()
            reader.join(timeout=10)
    outcome.returncode = process.returncode
    outcome.seconds = time.monotonic() - started
    outcome.tail = list(tail)
    return outcome


def child_environment(cuda: bool) -> dict[str, str]:
    """The children's environment: this checkout's kerple, DeepSpeed on the right accelerator (no GPU
    visible to a CPU run), offline."""
    env = {**os.environ, "DS_ACCELERATOR": "cuda" if cuda else "cpu", "TOKENIZERS_PARALLELISM": "false"}
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        env.setdefault(key, "1")
    env.setdefault("WANDB_MODE", "offline")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # each train.py is a single rank of its own
    return env
