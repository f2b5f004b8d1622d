"""The progress of a run read from its metrics.jsonl: the steps of every run, the speed, the time still needed."""

from __future__ import annotations

import json
from pathlib import Path

from kerple.jobs.progress import MetricsFollower, Progress


def record(step: int, **metrics: float) -> str:
    return json.dumps({"step": step, "time": 0.0, **{f"train/{k}": v for k, v in metrics.items()}}) + "\n"


def test_the_follower_reads_only_new_complete_training_records(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(record(300, lm_loss=2.0))  # an earlier chunk's record: history
    follower = MetricsFollower(path)
    assert follower.poll() == [] and follower.step is None
    with open(path, "a") as handle:
        handle.write(record(310, lm_loss=1.9, tokens_per_s=500.0))
        handle.write(json.dumps({"step": 310, "validation/lm_loss": 2.1}) + "\n")
        handle.write(record(320, lm_loss=1.8)[:20])  # the trainer is still writing this line
    assert [r["step"] for r in follower.poll()] == [310] and follower.step == 310
    with open(path, "a") as handle:
        handle.write(record(320, lm_loss=1.8)[20:])
    assert [r["step"] for r in follower.poll()] == [320] and follower.step == 320
    assert MetricsFollower(tmp_path / "absent.jsonl").poll() == []


def test_eta_counts_every_runs_remaining_steps_and_evaluations() -> None:
    progress = Progress(steps=100, pos_embs=("kerple_log", "alibi"), deadline=1000.0)
    assert "ETA ? (no step timed yet)" in progress.line(now=0.0)
    assert not progress.observe("kerple_log", [])
    records = [json.loads(record(20, lm_loss=6.0, tokens_per_s=9.0, step_time_s=9.0)),
               json.loads(record(40, lm_loss=5.5, tokens_per_s=12_345.0, step_time_s=0.5))]
    assert progress.observe("kerple_log", records)
    assert progress.remaining_seconds() == (60 + 100) * 0.5  # 60 steps left here, 100 in alibi, 0.5 s each
    assert progress.line(now=400.0) == (
        "progress: kerple_log step 40/100 | all runs 40/200 steps (20.0%), 0/2 evaluated | 12,345 tok/s | "
        "ETA 1:20 + evaluation | this chunk ends in 10:00")
    progress.done["kerple_log"] = 100
    progress.evaluated.add("kerple_log")
    progress.eval_seconds.append(30.0)
    assert progress.remaining_seconds() == 100 * 0.5 + 30.0  # alibi's steps and its evaluation


def test_the_line_is_due_at_most_once_per_interval() -> None:
    progress = Progress(steps=10, pos_embs=("none",), every_s=30.0)
    assert progress.due(now=100.0) and not progress.due(now=120.0) and progress.due(now=131.0)
