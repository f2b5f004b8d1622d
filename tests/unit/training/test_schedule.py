"""AnnealingLR against the reference's ``get_lr`` (docs/reference-format.md §5), restated here
independently, at every step; and what resuming does with the schedule values of a checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from kerple.config import ConfigError
from kerple.training.schedule import AnnealingLR, annealing_lr


def reference_lr(num_iters: int, start_lr: float, warmup_iter: float, end_iter: int, style: str, min_lr: float) -> float:
    """GPT-NeoX 2022 (KERPLE fork) ``AnnealingLR.get_lr``, written from its description."""
    clamped = min(num_iters, end_iter - warmup_iter)
    if warmup_iter > 0 and num_iters <= warmup_iter:
        return start_lr * clamped / warmup_iter
    clamped -= warmup_iter
    if style == "linear":
        value = start_lr * (end_iter - clamped) / end_iter
    elif style == "cosine":
        value = start_lr / 2.0 * (math.cos(math.pi * clamped / end_iter) + 1)
    elif style == "exponential":
        value = start_lr * math.exp(-0.693 * clamped / end_iter)
    else:
        value = start_lr
    return max(value, min_lr)


def scheduler(**kwargs) -> tuple[AnnealingLR, torch.optim.Optimizer]:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return AnnealingLR(optimizer, **kwargs), optimizer


@pytest.mark.parametrize("style", ["cosine", "linear", "exponential", "constant"])
@pytest.mark.parametrize(("warmup", "min_lr"), [(0.01, 0.0), (0.1, 6e-5), (0.0, 0.0), (0.6, 0.0)])
def test_every_step_matches_the_reference(style: str, warmup: float, min_lr: float) -> None:
    sched, optimizer = scheduler(lr=6e-4, warmup=warmup, decay_iters=1000, style=style, min_lr=min_lr)
    for n in range(0, 1200):  # past the end: the clamp holds the rate
        expected = reference_lr(n, 6e-4, warmup * 1000, 1000, style, min_lr)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12, abs=1e-18), n
        sched.step()


def test_last_percent_of_a_long_cosine_run() -> None:
    """50k steps, 1% warm-up: from step 49,500 on the reference holds the rate of m = 49,000."""
    sched, optimizer = scheduler(lr=6e-4, warmup=0.01, decay_iters=50000, style="cosine")
    sched.step(49_000)
    for n in range(49_000, 50_001):
        expected = reference_lr(n, 6e-4, 500.0, 50000, "cosine", 0.0)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
        sched.step()
    final = annealing_lr(50_000, lr=6e-4, warmup_iters=500.0, decay_iters=50000, style="cosine")
    assert final == pytest.approx(3e-4 * (math.cos(math.pi * 0.98) + 1), rel=1e-12)
    assert final == pytest.approx(5.92e-7, rel=1e-3)  # not 1.48e-7, the unclamped value
    assert annealing_lr(49_500, lr=6e-4, warmup_iters=500.0, decay_iters=50000, style="cosine") == final


def test_first_step_runs_at_zero_and_exponential_halves() -> None:
    assert annealing_lr(0, lr=1.0, warmup_iters=10, decay_iters=100, style="cosine") == 0.0
    assert annealing_lr(10, lr=1.0, warmup_iters=10, decay_iters=100, style="cosine") == 1.0
    # exp(-0.693 * m / end): half the rate after m = end steps of decay (here clamped at end - 2 w)
    assert annealing_lr(100, lr=1.0, warmup_iters=0, decay_iters=100, style="exponential") == pytest.approx(0.5, rel=1e-3)


def test_state_dict_round_trip_restores_position() -> None:
    first, _ = scheduler(lr=1e-3, warmup=0.1, decay_iters=50)
    for _ in range(17):
        first.step()
    second, second_opt = scheduler(lr=1e-3, warmup=0.1, decay_iters=50)
    second.load_state_dict(first.state_dict())
    assert second_opt.param_groups[0]["lr"] == first.get_lr()[0]
    assert second.num_steps == 17


def saved_state(steps: int = 30) -> dict:
    sched, _ = scheduler(lr=1e-3, warmup=0.1, decay_iters=50, style="cosine")
    sched.step(steps)
    return sched.state_dict()


def test_resume_with_other_values_is_an_error_by_default() -> None:
    """Both options false, the reference's defaults: configured and saved values must agree."""
    same, _ = scheduler(lr=1e-3, warmup=0.1, decay_iters=50, style="cosine", override_lr_scheduler=False)
    same.load_state_dict(saved_state())
    assert same.num_steps == 30
    other, _ = scheduler(lr=2e-3, warmup=0.1, decay_iters=100, style="cosine", override_lr_scheduler=False)
    with pytest.raises(ConfigError, match="lr: checkpoint 0.001, config 0.002"):
        other.load_state_dict(saved_state())


def test_a_new_decay_length_is_named_and_the_warmup_it_rescales_is_not() -> None:
    """A finished run continued with a longer train_iters: the decay length differs, and the warm-up's
    step count with it, but the warm-up setting (a fraction) is the same and must not be blamed."""
    longer, _ = scheduler(lr=1e-3, warmup=0.1, decay_iters=80, style="cosine", override_lr_scheduler=False)
    with pytest.raises(ConfigError) as refused:
        longer.load_state_dict(saved_state())
    message = str(refused.value)
    assert refused.value.key == "lr_decay_iters" and "warmup" not in message, message
    assert "lr_decay_iters: checkpoint 50, config 80 (train_iters when lr_decay_iters is unset)" in message
    other_warmup, _ = scheduler(lr=1e-3, warmup=0.2, decay_iters=50, style="cosine", override_lr_scheduler=False)
    with pytest.raises(ConfigError, match="warmup: checkpoint 0.1, config 0.2"):
        other_warmup.load_state_dict(saved_state())


def test_use_checkpoint_takes_the_saved_schedule() -> None:
    sched, optimizer = scheduler(lr=2e-3, warmup=0.0, decay_iters=100, style="linear", min_lr=1e-5,
                                 use_checkpoint_lr_scheduler=True, override_lr_scheduler=False)
    sched.load_state_dict(saved_state())
    assert (sched.lr, sched.min_lr, sched.warmup_iters, sched.decay_iters, sched.style) == (1e-3, 0.0, 5.0, 50, "cosine")
    assert optimizer.param_groups[0]["lr"] == pytest.approx(reference_lr(30, 1e-3, 5.0, 50, "cosine", 0.0), rel=1e-12)


def test_override_keeps_the_configured_schedule() -> None:
    sched, optimizer = scheduler(lr=2e-3, warmup=0.0, decay_iters=100, style="linear", override_lr_scheduler=True)
    sched.load_state_dict(saved_state())
    assert (sched.lr, sched.decay_iters, sched.style, sched.num_steps) == (2e-3, 100, "linear", 30)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(reference_lr(30, 2e-3, 0.0, 100, "linear", 0.0), rel=1e-12)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="lr_decay_style"):
        scheduler(lr=1.0, warmup=0.0, decay_iters=5, style="exp")
    with pytest.raises(ValueError, match="both"):
        scheduler(lr=1.0, warmup=0.0, decay_iters=5, use_checkpoint_lr_scheduler=True, override_lr_scheduler=True)
