"""fp16 on a CUDA GPU: DeepSpeed's dynamic loss scaler skips an overflowing step and the trainer
counts it. Skipped without CUDA; fp16 on CPU is refused (test_checkpoint.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tiny_run import single_process_group, tiny_config, train, write_corpus

pytestmark = pytest.mark.gpu


@pytest.fixture()
def parallel():
    yield from single_process_group()


def test_overflow_skips_a_step_and_is_counted(parallel, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    # A loss scale of 2^32 overflows fp16 gradients (max 65504) on the first step, so the scaler
    # must skip that update and halve the scale until the gradients fit.
    fp16 = {"enabled": True, "initial_scale_power": 32, "loss_scale_window": 1000, "hysteresis": 1, "min_loss_scale": 1}
    cfg = tiny_config(corpus, fp16=fp16, train_iters=6, lr_decay_iters=6, attention_impl="eager")
    result = train(cfg, parallel)
    assert result.iteration == 6
    assert result.skipped_steps >= 1
    assert result.skipped_steps < 6, "every step skipped: the scaler never recovered"
    assert all(math.isfinite(loss) for loss in result.losses)
    assert torch.cuda.is_available()
