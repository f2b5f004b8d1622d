"""kill -9 in the middle of writing a checkpoint leaves the previous one loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "unit" / "training"
sys.path.insert(0, str(HERE))

from kerple.model import build_model  # noqa: E402
from kerple import checkpoint as ckpt  # noqa: E402
from tiny_run import REPO, tiny_overrides, write_corpus  # noqa: E402

# Runs train.py's code path in a child; while writing global_step4 it announces itself and stalls.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {here!r})
    import kerple.atomic as atomic
    real_save = atomic.torch_save_atomic
    def slow_save(obj, path):
        real_save(obj, path)
        if "global_step4" in str(path):
            Path({marker!r}).write_text("writing")
            time.sleep(120)
    atomic.torch_save_atomic = slow_save
    from kerple.config import load_config
    from kerple.training.trainer import run_training
    cfg = load_config([{tiny!r}], {overrides!r})
    run_training(cfg)
    """
)


@pytest.mark.slow
def test_kill_during_save_keeps_previous_checkpoint(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "data" / "corpus")
    save, marker = tmp_path / "ck", tmp_path / "marker"
    overrides = tiny_overrides(corpus, train_iters=6, save=str(save), save_interval=2)
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(here=str(HERE), marker=str(marker), tiny=str(REPO / "configs/models/tiny.yml"),
                                   overrides=overrides))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    child = subprocess.Popen([sys.executable, str(script)], env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while not marker.exists():
            assert child.poll() is None, child.stderr.read().decode()[-3000:]
            assert time.time() < deadline, "child never reached the save"
            time.sleep(0.2)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        child.stderr.close()

    assert (save / "latest").read_text() == "global_step2"
    assert (save / ".tmp-global_step4").is_dir()  # the half-written one, never committed
    assert not (save / "global_step4").exists()
    model = build_model(load_tiny(corpus))
    assert ckpt.load_model_weights(model, save) == 2
    assert ckpt.find_checkpoint(save) == save / "global_step2"


def load_tiny(corpus: Path):
    from tiny_run import tiny_config

    return tiny_config(corpus)
