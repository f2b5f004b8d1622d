"""Child processes under a deadline: asked to stop with SIGTERM, killed when they do not, output kept."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kerple.jobs.process import StopRequest, run_child

# A stand-in for train.py: prints a step every 50 ms; on SIGTERM it "saves" and exits 0 (or ignores it).
CHILD = """
import signal, sys, time
stopping = []
if sys.argv[1] == "obey":
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for step in range(1, int(sys.argv[2]) + 1):
    print(f"step {step}/{sys.argv[2]}", flush=True)
    if stopping:
        print(f"saved at step {step}", flush=True)
        sys.exit(0)
    time.sleep(0.05)
"""


def _run(tmp_path: Path, mode: str, steps: int, on_line=None, **kwargs):  # type: ignore[no-untyped-def]
    lines: list[str] = []

    def seen(line: str) -> None:
        lines.append(line)
        if on_line is not None:
            on_line(line)

    started = time.monotonic()
    outcome = run_child([sys.executable, "-c", CHILD, mode, str(steps)], log_path=tmp_path / "logs" / "child.log",
                        on_line=seen, **kwargs)
    return outcome, lines, time.monotonic() - started


def test_a_child_that_finishes(tmp_path: Path) -> None:
    outcome, lines, _ = _run(tmp_path, "obey", 3, stop=StopRequest())
    assert outcome.ok and outcome.stopped is None and not outcome.killed
    assert lines == ["step 1/3", "step 2/3", "step 3/3"] and outcome.tail == lines
    assert "step 3/3" in (tmp_path / "logs" / "child.log").read_text()


def test_the_deadline_asks_the_child_to_stop_and_it_saves(tmp_path: Path) -> None:
    deadline = time.monotonic() + 1.5
    outcome, lines, seconds = _run(tmp_path, "obey", 1000, stop=StopRequest(), deadline=deadline, margin=0.5, grace=5)
    assert outcome.ok and outcome.stopped == "deadline" and not outcome.killed
    assert lines[-1].startswith("saved at step") and seconds < 4


def test_a_child_ignoring_the_request_is_killed_after_the_grace(tmp_path: Path) -> None:
    deadline = time.monotonic() + 1.0
    outcome, lines, seconds = _run(tmp_path, "ignore", 1000, stop=StopRequest(), deadline=deadline, grace=0.5)
    assert outcome.killed and outcome.returncode == -9 and outcome.stopped == "deadline"
    assert not any(line.startswith("saved") for line in lines) and seconds < 4


def test_a_stop_request_reaches_the_child_and_a_second_kills_it(tmp_path: Path) -> None:
    stop = StopRequest()

    def signal_at_step_3(line: str) -> None:
        if line == "step 3/1000":
            stop.count = 1  # as after one SIGINT/SIGTERM to this process, once the child is in its loop

    outcome, lines, _ = _run(tmp_path, "obey", 1000, on_line=signal_at_step_3, stop=stop, grace=5)
    assert outcome.ok and outcome.stopped == "signal" and lines[-1].startswith("saved at step")

    stop = StopRequest()

    def two_signals(line: str) -> None:
        if line == "step 3/1000":
            stop.count = 2

    outcome, lines, seconds = _run(tmp_path, "ignore", 1000, on_line=two_signals, stop=stop, grace=30)
    assert outcome.killed and outcome.stopped == "signal" and seconds < 10
