"""deepy.py passes SIGINT/SIGTERM on to the trainer it started and exits with the trainer's status:
130 after Ctrl-C (an interrupted run), 0 after SIGTERM (a preemption: saved, the same command resumes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "training"))

from kerple.training import cli  # noqa: E402
from tiny_run import REPO, tiny_overrides, write_corpus  # noqa: E402


def test_the_child_status_is_returned() -> None:
    assert cli.run_child([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert cli.run_child([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]) == 128 + 9


def start_deepy(tmp_path: Path, **overrides) -> subprocess.Popen:
    """deepy.py training the tiny model on a fresh corpus, single-process, in a session of its own."""
    corpus = write_corpus(tmp_path / "corpus")
    settings = tiny_overrides(corpus, save=str(tmp_path / "run"), log_dir=str(tmp_path / "logs"), **overrides)
    argv = [f"{key}={'' if value is None else value}" for key, value in settings.items()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return subprocess.Popen([sys.executable, "deepy.py", "train.py", "configs/models/tiny.yml", *argv], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def stop_group(deepy: subprocess.Popen) -> None:
    """Kill the process group the test started, should anything be left."""
    try:
        os.killpg(deepy.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_deepy_stops_the_trainer_cleanly(tmp_path: Path, signum: int) -> None:
    save = tmp_path / "run"
    deepy = start_deepy(tmp_path, train_iters=2000, lr_decay_iters=2000, log_interval=1)
    try:
        lines = []
        for line in deepy.stdout:
            lines.append(line)
            if "step" in line and "/2000" in line:
                break  # the trainer is in its loop
        deepy.send_signal(signum)  # to deepy alone, not to its process group
        rest, _ = deepy.communicate(timeout=120)
        output = "".join(lines) + rest
        assert deepy.returncode == (130 if signum == signal.SIGINT else 0), output[-3000:]
        assert "received signal; saved at step" in output and "training interrupted at step" in output
        step = int((save / "latest").read_text().removeprefix("global_step"))
        assert 0 < step < 2000
    finally:
        stop_group(deepy)


def test_ctrl_c_while_the_trainer_is_still_importing_is_one_line(tmp_path: Path) -> None:
    """It gave a 77-line traceback (KeyboardInterrupt inside torch's imports) and exit 130."""
    deepy = start_deepy(tmp_path)
    try:
        lines = []
        for line in deepy.stdout:
            lines.append(line)
            if line.startswith(f"deepy: {sys.executable}"):
                break  # the child is starting: its imports take seconds
        time.sleep(1.0)
        deepy.send_signal(signal.SIGINT)
        rest, _ = deepy.communicate(timeout=120)
        output = "".join(lines) + rest
        assert deepy.returncode == 130, output[-3000:]
        assert "Traceback" not in output and "train.py: interrupted" in output, output[-3000:]
        assert not (tmp_path / "run" / "latest").exists()
    finally:
        stop_group(deepy)
