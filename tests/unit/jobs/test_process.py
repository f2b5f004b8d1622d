"""The one child-process runner: a deadline asks with SIGTERM and kills past the grace, output kept, a failure
one line, a child's Ctrl-C an interrupt here."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from kerple.jobs.process import ChildFailed, StopRequest, run_child

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


def test_a_failure_is_one_line_ending_with_the_childs_last_line(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    refusal = "import sys; print('x'); print('train.py: error: seq_length 0: expected at least 1'); sys.exit(2)"
    outcome = run_child([sys.executable, "-c", refusal], capture=True, session=False)
    with pytest.raises(ChildFailed, match=r"^\[alibi\] train.py exited with status 2: train.py: error: seq_length 0"):
        outcome.check("[alibi] train.py")
    assert capsys.readouterr().err == ""  # a refusal says it all
    crash = "import sys; print('Traceback (most recent call last):'); print('ZeroDivisionError: x'); sys.exit(1)"
    with pytest.raises(ChildFailed, match="status 1: ZeroDivisionError: x$"):
        run_child([sys.executable, "-c", crash], capture=True).check("evaluate.py")
    assert "Traceback" in capsys.readouterr().err  # a crash shows the lines before its last
    run_child([sys.executable, "-c", "pass"], capture=True).check("fine")


def test_a_child_stopped_by_ctrl_c_interrupts_this_process() -> None:
    outcome = run_child([sys.executable, "-c", "import sys; sys.exit(130)"], capture=True)
    assert outcome.interrupted
    with pytest.raises(KeyboardInterrupt):
        outcome.check("train.py")
    by_signal = run_child([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGINT)"],
                          capture=True)
    assert by_signal.returncode in (130, -signal.SIGINT) and by_signal.interrupted


def test_without_a_stop_signal_the_deadline_kills_the_group_and_ticks_run(tmp_path: Path) -> None:
    """The GPU check's steps: no polite request, killed past budget + grace, the grandchild too."""
    marker = tmp_path / "grandchild-alive"
    grandchild = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).write_text('1')"
    child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(60)"
    ticks: list[float] = []
    started = time.monotonic()
    outcome = run_child([sys.executable, "-c", child], deadline=started + 1.0, stop_signal=None,
                        on_tick=lambda: ticks.append(time.monotonic()))
    assert outcome.killed and outcome.returncode == -9 and outcome.stopped == "deadline"
    assert time.monotonic() - started < 3 and len(ticks) >= 5
    time.sleep(3.5)
    assert not marker.exists()  # its whole process group went
