"""AnnealingLR against the formula of docs/reference-format.md §5, restated here independently."""

from __future__ import annotations

import math

import pytest
import torch

from kerple.training.schedule import AnnealingLR, annealing_lr


def expected_lr(n: int, lr: float, warmup_frac: float, end: int, style: str, min_lr: float) -> float:
    warmup_iters = warmup_frac * end
    if warmup_iters > 0 and n <= warmup_iters:
        return lr * n / warmup_iters
    m = n - warmup_iters
    if style == "cosine":
        value = lr / 2 * (math.cos(math.pi * m / end) + 1)  # divides by end, not end - warmup
    elif style == "linear":
        value = lr * (end - m) / end
    else:
        value = lr
    return max(value, min_lr)


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
@pytest.mark.parametrize("min_lr", [0.0, 6e-5])
def test_schedule_matches_formula(style: str, min_lr: float) -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    scheduler = AnnealingLR(optimizer, lr=6e-4, warmup=0.01, decay_iters=1000, style=style, min_lr=min_lr)
    for n in range(0, 1100):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(
            expected_lr(n, 6e-4, 0.01, 1000, style, min_lr), rel=1e-12, abs=1e-15
        ), n
        scheduler.step()


def test_first_step_runs_at_zero_and_cosine_ends_above_zero() -> None:
    assert annealing_lr(0, lr=1.0, warmup_iters=10, decay_iters=100, style="cosine") == 0.0
    assert annealing_lr(10, lr=1.0, warmup_iters=10, decay_iters=100, style="cosine") == 1.0
    end_value = annealing_lr(100, lr=1.0, warmup_iters=10, decay_iters=100, style="cosine")
    assert end_value == pytest.approx((math.cos(math.pi * 0.9) + 1) / 2)
    assert end_value > 0.02


def test_state_dict_round_trip_restores_position() -> None:
    params = [torch.nn.Parameter(torch.zeros(1))]
    first = AnnealingLR(torch.optim.AdamW(params, lr=1.0), lr=1e-3, warmup=0.1, decay_iters=50)
    for _ in range(17):
        first.step()
    second_opt = torch.optim.AdamW(params, lr=1.0)
    second = AnnealingLR(second_opt, lr=1e-3, warmup=0.1, decay_iters=50)
    second.load_state_dict(first.state_dict())
    assert second_opt.param_groups[0]["lr"] == first.get_lr()[0]
    assert second.num_steps == 17


def test_bad_style_is_rejected() -> None:
    with pytest.raises(ValueError, match="lr_decay_style"):
        AnnealingLR(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]), lr=1.0, warmup=0.0, decay_iters=5, style="exp")
