"""The console's loss is the mean over the log interval, as GPT-NeoX prints it.

GPT-NeoX's ``training_log`` (megatron/logging.py), restated: each iteration's ``lm_loss`` is added to
a running total unless the fp16 loss scaler skipped the iteration; skipped iterations are counted, and
among them those whose loss was not finite ("nan iterations"); every ``log_interval``-th iteration
prints the total divided by the iterations not skipped, both counts and, for fp16, the loss scale, then
starts over. The expected values below are computed from the per-step losses of the run.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from kerple.training.interval import LossInterval
from kerple.training.trainer import Trainer
from tiny_run import corpus, parallel, tiny_config, train  # noqa: F401  (fixtures)

LINE = re.compile(r"^step +(\d+)/\d+ \| loss (\S+)")


def console_losses(output: str) -> dict[int, float]:
    """``{step: loss}`` of the trainer's progress lines."""
    found = {}
    for line in output.splitlines():
        match = LINE.match(line)
        if match:
            found[int(match.group(1))] = float(match.group(2))
    return found


def lines_by_step(output: str) -> dict[int, str]:
    return {int(m.group(1)): line for line in output.splitlines() if (m := LINE.match(line))}


def records(log_dir: Path) -> dict[int, dict[str, float]]:
    lines = (json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines())
    return {record["step"]: record for record in lines if "train/lm_loss" in record}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_the_console_loss_is_the_mean_over_the_interval(parallel, corpus: Path, tmp_path: Path,  # noqa: F811
                                                        capsys: pytest.CaptureFixture) -> None:
    """12 steps, log_interval 5: lines at 1 (the first step at once), 5, 10 and 12 (the end). Step 5's
    loss is the mean of steps 1-5 (the first line does not start a new interval: GPT-NeoX prints
    nothing there), 10's of 6-10, 12's of 11-12. A record keeps its own step's loss as ``lm_loss``."""
    logs = tmp_path / "logs"
    result = train(tiny_config(corpus, train_iters=12, log_interval=5, log_dir=str(logs)), parallel)
    loss = dict(result.losses)
    assert sorted(loss) == list(range(1, 13))
    shown = console_losses(capsys.readouterr().out)
    expected = {1: loss[1], 5: mean([loss[s] for s in range(1, 6)]), 10: mean([loss[s] for s in range(6, 11)]),
                12: mean([loss[11], loss[12]])}
    assert sorted(shown) == sorted(expected)
    for step, value in expected.items():
        assert shown[step] == pytest.approx(value, abs=1e-6), step
    assert abs(shown[10] - loss[10]) > 1e-5  # the mean, not the last step (the loss falls in this run)
    logged = records(logs)
    assert sorted(logged) == [5, 10, 12]
    for step, steps in ((5, 5), (10, 5), (12, 2)):
        assert logged[step]["train/lm_loss"] == pytest.approx(loss[step], rel=1e-6)
        assert logged[step]["train/lm_loss_interval_mean"] == pytest.approx(expected[step], rel=1e-6)
        assert logged[step]["train/interval_steps"] == steps and logged[step]["train/interval_skipped_steps"] == 0


def test_a_run_resumed_mid_interval_averages_the_steps_it_ran(parallel, corpus: Path, tmp_path: Path,  # noqa: F811
                                                              capsys: pytest.CaptureFixture) -> None:
    """Stopped at step 3 and resumed (log_interval 5): the resumed run's step-5 line is the mean of steps
    4 and 5, the only ones it ran in that interval (GPT-NeoX divides their total by 5, printing about
    0.4 of the loss: kerple.training.interval says why this differs), and step 10's is the mean of 6-10."""
    save, logs = tmp_path / "ck", tmp_path / "logs"
    common = dict(log_interval=5, save=str(save), log_dir=str(logs))
    train(tiny_config(corpus, train_iters=3, **common), parallel)
    capsys.readouterr()
    resumed = train(tiny_config(corpus, train_iters=10, load=str(save), **common), parallel)
    loss = dict(resumed.losses)
    assert sorted(loss) == list(range(4, 11))
    shown = console_losses(capsys.readouterr().out)
    assert sorted(shown) == [4, 5, 10]
    assert shown[4] == pytest.approx(loss[4], abs=1e-6)
    assert shown[5] == pytest.approx((loss[4] + loss[5]) / 2, abs=1e-6)
    assert shown[10] == pytest.approx(mean([loss[s] for s in range(6, 11)]), abs=1e-6)
    assert records(logs)[5]["train/interval_steps"] == 2


def test_skipped_steps_are_left_out_and_counted_per_interval(parallel, corpus: Path, tmp_path: Path,  # noqa: F811
                                                             capsys: pytest.CaptureFixture) -> None:
    """An fp16 overflow, played by a stand-in (fp16 itself needs CUDA: test_fp16_gpu.py): DeepSpeed's
    skip counter rises at steps 2 and 3, and step 3's loss is infinite. The step-5 line averages steps
    1, 4 and 5, says ``skipped 2`` and ``nan 1`` for the interval, and shows the loss scale; the step-10
    line's interval skipped nothing."""
    logs = tmp_path / "logs"
    cfg = tiny_config(corpus, train_iters=10, log_interval=5, log_dir=str(logs)).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    trainer.precision = "fp16"  # what read_losses and the log line check; the step itself stays fp32
    trainer.optimizer.loss_scale = 4096.0  # DeepSpeed's fp16 optimizers expose the scale by this name
    original_step = trainer.train_step
    real: dict[int, float] = {}

    def overflowing_step() -> torch.Tensor:
        loss = original_step()
        real[trainer.iteration] = float(loss)
        if trainer.iteration in (2, 3):
            trainer.skipped_steps += 1
        return torch.tensor(math.inf) if trainer.iteration == 3 else loss

    trainer.train_step = overflowing_step
    try:
        result = trainer.train()
    finally:
        trainer.close()
    assert result.skipped_steps == 2
    lines = lines_by_step(capsys.readouterr().out)
    shown = console_losses("\n".join(lines.values()))
    assert shown[5] == pytest.approx(mean([real[1], real[4], real[5]]), abs=1e-6)
    assert "| skipped 2 (2 in all) |" in lines[5] and "| nan 1" in lines[5] and "| loss-scale 4096 |" in lines[5]
    assert shown[10] == pytest.approx(mean([real[s] for s in range(6, 11)]), abs=1e-6)
    assert "| skipped 0 (2 in all)" in lines[10] and "nan" not in lines[10]
    logged = records(logs)
    assert logged[5]["train/interval_skipped_steps"] == 2 and logged[5]["train/interval_nan_steps"] == 1
    assert logged[5]["train/loss_scale"] == 4096.0 and logged[10]["train/interval_skipped_steps"] == 0


def test_the_interval_follows_gpt_neox_rules() -> None:
    """Skipped steps stay out of the total and the divisor; a non-finite loss counts only as skipped;
    an interval of skipped steps alone has no mean; reset starts over."""
    interval = LossInterval()
    interval.mark_skipped(2)
    interval.mark_skipped(3)
    interval.add([(1, 2.0), (2, 100.0)])
    interval.add([(3, math.nan), (4, 4.0)])
    assert interval.mean() == 3.0 and (interval.steps, interval.skipped, interval.nan_skipped) == (4, 2, 1)
    interval.reset()
    interval.mark_skipped(5)
    interval.add([(5, 1.0)])
    assert interval.mean() is None and interval.steps == 1 and interval.nan_skipped == 0


def test_the_training_loop_reads_the_device_only_at_log_steps(parallel, corpus: Path) -> None:  # noqa: F811
    """Host synchronizations (``aten::_local_scalar_dense``) over a whole run: 8 steps logged at 1, 4
    and 8 against 16 steps logged at 1, 8 and 16. The same count means the 8 extra steps, those between
    log lines, add none: the interval's mean comes from the losses read at the log steps."""
    from torch.profiler import ProfilerActivity, profile

    from kerple.measure.host_work import count_host_work

    counts = []
    for steps, log_interval in ((8, 4), (16, 8)):
        cfg = tiny_config(corpus, train_iters=steps, lr_decay_iters=16, log_interval=log_interval,
                          eval_iters=0).resolve_batch(1)
        trainer = Trainer(cfg, parallel)
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                trainer.train()
        finally:
            trainer.close()
        counts.append(count_host_work(prof.events(), steps=1).syncs)
    assert counts[0] == counts[1], counts


def test_the_first_interval_is_timed_from_its_first_step(parallel, corpus: Path, tmp_path: Path,  # noqa: F811
                                                         capsys: pytest.CaptureFixture) -> None:
    """GPT-NeoX's "elapsed time per iteration" is the time since the previous line over the steps in it;
    the first step's own line (kerple's, printed at once) does not start a new interval, so a first step
    held up for a second (a stand-in for compilation) shows in the step-5 line's time: at least 1000 ms / 5.
    The step-10 line's interval does not hold it."""
    import time

    logs = tmp_path / "logs"
    cfg = tiny_config(corpus, train_iters=10, log_interval=5, log_dir=str(logs)).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    original_step = trainer.train_step

    def slow_first_step() -> torch.Tensor:
        if trainer.iteration == 0:
            time.sleep(1.0)
        return original_step()

    trainer.train_step = slow_first_step
    try:
        trainer.train()
    finally:
        trainer.close()
    lines = lines_by_step(capsys.readouterr().out)
    step_ms = {step: float(re.search(r"\| (\d+) ms/step", line).group(1)) for step, line in lines.items()}
    assert step_ms[1] >= 1000 and step_ms[5] >= 200, step_ms
    assert step_ms[10] < 200, step_ms
    logged = records(logs)
    assert logged[5]["train/step_time_s"] >= 0.2 > logged[10]["train/step_time_s"]
