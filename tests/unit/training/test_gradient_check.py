"""The first step's check that the positional parameters got a gradient (kerple/training/gradient_check.py):
silent for every registered embedding trained the way ``auto`` trains it on a CPU; a run whose kernel
drops the embedding's gradient stops at step 1, saying which parameters and what to change."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kerple import positional
from kerple.training.errors import TrainingError
from kerple.training.gradient_check import ungraded_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from model_helpers import VOCAB, tiny_model  # noqa: E402
from tiny_run import corpus, parallel, tiny_config, train  # noqa: E402,F401


@pytest.mark.parametrize("name", positional.names())
def test_every_embedding_trained_as_auto_trains_it_passes(name: str) -> None:
    model = tiny_model(name, impl="auto").train()
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    model(tokens, labels=torch.roll(tokens, -1, dims=1)).backward()
    assert ungraded_parameters(model) == []


def test_missing_and_all_zero_gradients_are_named() -> None:
    model = tiny_model("kerple_log", impl="eager").train()
    assert ungraded_parameters(model) == ["positional.bias_a", "positional.bias_p"]  # no backward yet
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    model(tokens, labels=torch.roll(tokens, -1, dims=1)).backward()
    model.positional.bias_p.grad.zero_()
    model.positional.bias_a.grad[0] = 0.0  # one head without a gradient is not a dropped gradient
    assert ungraded_parameters(model) == ["positional.bias_p"]


def test_a_kernel_that_drops_the_gradient_stops_the_run_at_step_1(parallel, corpus: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the fused CPU attention run without its diagonals' gradient (what compiled SDPA did to
    kerple_log on an H200)."""
    from kerple.model import sdpa_cpu

    fused = sdpa_cpu.masked_attention
    monkeypatch.setattr(sdpa_cpu, "masked_attention",
                        lambda query, key, value, mask, diagonals=None, window=None: fused(query, key, value, mask,
                                                                                            None, window))
    save = tmp_path / "run"
    with pytest.raises(TrainingError) as raised:
        train(tiny_config(corpus, train_iters=3, attention_impl="sdpa", save=str(save), save_interval=1), parallel)
    message = str(raised.value)
    assert message.startswith("positional.bias_a, positional.bias_p got no gradient in the first training step: "
                              "attention_impl 'sdpa' (eager layers, cpu)"), message
    assert "Change 'attention-impl'" in message and "nothing was saved" in message
    assert not (save / "latest").exists()
