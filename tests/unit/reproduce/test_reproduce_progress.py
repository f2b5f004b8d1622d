"""The progress line: steps of every run, the speed read from the trainer, and the time still needed."""

from __future__ import annotations

from kerple.reproduce.progress import Progress

LINE = "step     40/100 | loss 5.5 | lr 3.0e-03 | 12,345 tok/s | 500 ms/step | ETA 0:30 | bias_a 0.3[0.1,0.7]"


def test_eta_counts_every_runs_remaining_steps_and_evaluations() -> None:
    progress = Progress(steps=100, pos_embs=("kerple_log", "alibi"), deadline=1000.0)
    assert "ETA ? (no step timed yet)" in progress.line(now=0.0)
    assert not progress.observe("kerple_log", "validation at step 40: lm_loss 5.0")
    assert progress.observe("kerple_log", LINE)
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
