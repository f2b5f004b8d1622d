"""kerple.measure.eval_memory: the memory estimate by hand, the skip rules, and one real cell measured
in its child process."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from kerple.measure import eval_memory
from kerple.measure.eval_memory import EvalSettings, estimate_bytes, load_model_config, measure_all

SETTINGS = EvalSettings(configs=[], pos_emb="kerple_log", impls=["eager", "flex"], chunk_size=1024, device="cpu",
                        max_seconds=3.0)


def test_the_estimate_of_the_tiny_model_at_512_tokens() -> None:
    cfg = load_model_config([], "kerple_log")  # 2 layers, h 192, 12 heads, vocab 512
    activations = 4 * 512 * (8 * 192 + 2 * 4 * 192)  # fp32, one layer at a time
    logits = 3 * 4 * 512 * 512  # the chunk is the whole sequence (1024 > 512)
    tables = 2 * 4 * 12 * 512
    scores = 5 * 4 * 12 * 512**2 + 9 * 512**2  # eager: five fp32 [H, L, L] copies, distance and mask
    assert estimate_bytes("eager", 512, cfg, 1024) == activations + logits + tables + scores == 74_760_192
    assert estimate_bytes("flex", 512, cfg, 1024) == activations + logits + tables
    assert estimate_bytes("triton", 512, cfg, 1024) == activations + logits + tables  # online softmax: no scores
    assert estimate_bytes("sdpa", 512, cfg, 1024) == activations + logits + tables + 2 * 4 * 12 * 512**2 + 9 * 512**2


def _no_child(*args: object, **kwargs: object) -> None:
    raise AssertionError("a skipped cell started a process")


def test_cells_over_the_budget_are_skipped_and_so_are_longer_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", _no_child)
    cfg = load_model_config([], "kerple_log")
    cells = measure_all(SETTINGS, cfg, [256, 512], budget=1)
    assert [(c.impl, c.length) for c in cells] == [("eager", 256), ("eager", 512), ("flex", 256), ("flex", 512)]
    assert all(c.peak_bytes is None for c in cells)
    assert cells[0].note.startswith("skipped: estimated") and cells[2].note.startswith("skipped: estimated")
    assert cells[1].note == cells[3].note == "skipped: a shorter length was skipped or failed"


def test_a_length_projected_past_the_time_limit_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 s at 256 tokens projects 4 s at 512 (quadratic), over the 3 s limit; a failure blocks the rest."""
    outcomes = {("eager", 256): {"peak_bytes": 10, "seconds": 1.0, "loss": 6.0, "method": "VmHWM"},
                ("flex", 256): {"error": "out of memory"}}
    monkeypatch.setattr(eval_memory, "run_one", lambda settings, impl, length, timeout: outcomes[impl, length])
    cells = measure_all(SETTINGS, load_model_config([], "kerple_log"), [256, 512], budget=2**40)
    assert cells[0].peak_bytes == 10 and cells[0].tokens_per_second == 256.0 and cells[0].note == ""
    assert cells[1].note == "skipped: projected 4 s > --max-seconds 3"
    assert cells[2].note == "out of memory" and cells[3].note == "skipped: a shorter length failed"


@pytest.mark.process
def test_a_cell_is_measured_in_a_child_started_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child is ``python -m kerple.measure.eval_worker``: no script, no repository root on the path;
    it imports this kerple, not one in the folder it was started from (Python >= 3.11: PYTHONSAFEPATH)."""
    if sys.version_info >= (3, 11):
        (tmp_path / "kerple").mkdir()
        (tmp_path / "kerple" / "__init__.py").write_text("raise ImportError('the working folder reached sys.path')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    outcome = eval_memory.run_one(SETTINGS, "eager", 64, timeout=300)
    assert "error" not in outcome, outcome
    assert outcome["method"] in ("VmHWM", "ru_maxrss (whole process)") and outcome["peak_bytes"] > 0
    assert abs(outcome["loss"] - math.log(512)) < 0.5  # an untrained model: about ln(vocab)
