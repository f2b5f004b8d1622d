"""fp16 on a CUDA GPU: DeepSpeed's dynamic loss scaler skips an overflowing step and the trainer
counts it. Skipped without CUDA; fp16 on CPU is refused (test_checkpoint.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kerple.jobs.gpu_check.step_fp16 import overflow_scale_power
from tiny_run import single_process_group, tiny_config, train, write_corpus

pytestmark = pytest.mark.gpu


@pytest.fixture()
def parallel():
    yield from single_process_group()


def test_overflow_skips_a_step_and_is_counted(parallel, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    micro_batch, seq = 4, 32
    power = overflow_scale_power(micro_batch * seq)  # 24
    # Each overflow halves the scale once (hysteresis 1): after power - 14 skipped steps it is 2^14, where
    # every gradient entry below 4 fits fp16 (an untrained tiny model's are far smaller), so the run
    # recovers with steps to spare; the first step must be skipped.
    steps = power - 14 + 6
    fp16 = {"enabled": True, "initial_scale_power": power, "loss_scale_window": 1000, "hysteresis": 1,
            "min_loss_scale": 1}
    cfg = tiny_config(corpus, fp16=fp16, train_iters=steps, lr_decay_iters=steps, attention_impl="eager",
                      train_micro_batch_size_per_gpu=micro_batch, seq_length=seq)
    result = train(cfg, parallel)
    assert result.iteration == steps
    assert result.skipped_steps >= 1
    assert result.skipped_steps <= power - 14, "the scaler did not recover by 2^14"
    assert all(math.isfinite(loss) for _, loss in result.losses)
    assert torch.cuda.is_available()
    # GPT-NeoX's log line: the skipped step is left out of the mean (step 1's line has none), counted for
    # its interval, and every line gives the loss scale
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert "loss - (every step skipped)" in lines[0] and "| skipped 1 (1 in all)" in lines[0]
    assert all("| loss-scale " in line for line in lines)
