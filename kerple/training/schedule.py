"""Learning-rate schedule of GPT-NeoX's ``AnnealingLR`` (docs/reference-format.md §5).

The schedule is a function of the number of *completed optimizer steps* ``n``:

* warm-up: ``warmup_iters = warmup * lr_decay_iters`` (``warmup`` is a fraction); for
  ``n <= warmup_iters`` the rate is ``lr * n / warmup_iters`` (so the very first step runs at 0,
  exactly as in the reference);
* afterwards, with ``m = n - warmup_iters`` and ``end = lr_decay_iters``:
  ``linear``   ``lr * (end - m) / end``;
  ``cosine``   ``lr / 2 * (cos(pi * m / end) + 1)``  (divides by ``end``, not ``end - warmup_iters``,
  so the curve ends slightly above zero: a reference quirk kept on purpose);
  ``constant`` ``lr``;
* the result is floored at ``min_lr``.

DeepSpeed calls :meth:`AnnealingLR.step` after every optimizer step that was not skipped (an fp16
overflow does not advance the schedule), as it does for the reference.
"""

from __future__ import annotations

import math
from typing import Any

import torch

DECAY_STYLES = ("linear", "cosine", "constant")


def annealing_lr(
    step: int, *, lr: float, warmup_iters: float, decay_iters: int, style: str, min_lr: float = 0.0
) -> float:
    """The learning rate after ``step`` completed optimizer steps (docs/reference-format.md §5)."""
    if style not in DECAY_STYLES:
        raise ValueError(f"lr_decay_style {style!r} is not one of {', '.join(DECAY_STYLES)}")
    if warmup_iters > 0 and step <= warmup_iters:
        return lr * step / warmup_iters
    since_warmup = step - warmup_iters
    end = max(int(decay_iters), 1)
    if style == "linear":
        rate = lr * (end - since_warmup) / end
    elif style == "cosine":
        rate = lr / 2.0 * (math.cos(math.pi * since_warmup / end) + 1.0)
    else:
        rate = lr
    return max(rate, min_lr)


class AnnealingLR:
    """Sets ``lr`` on every parameter group of ``optimizer`` following :func:`annealing_lr`.

    It has the ``step()`` / ``state_dict()`` / ``load_state_dict()`` / ``get_lr()`` interface that
    ``deepspeed.initialize(lr_scheduler=...)`` expects. ``last_step`` is the number of optimizer
    steps already taken (non-zero when resuming).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        lr: float,
        warmup: float,
        decay_iters: int,
        style: str = "cosine",
        min_lr: float = 0.0,
        last_step: int = 0,
    ) -> None:
        if style not in DECAY_STYLES:
            raise ValueError(f"lr_decay_style {style!r} is not one of {', '.join(DECAY_STYLES)}")
        if not 0.0 <= warmup <= 1.0:
            raise ValueError(f"warmup is a fraction of lr_decay_iters, got {warmup}")
        self.optimizer = optimizer
        self.lr = float(lr)
        self.warmup_iters = float(warmup) * int(decay_iters)
        self.decay_iters = int(decay_iters)
        self.style = style
        self.min_lr = float(min_lr)
        self.num_steps = int(last_step)
        self.step(self.num_steps)

    def get_lr(self) -> list[float]:
        """Current learning rate, one entry per parameter group (DeepSpeed's convention)."""
        rate = annealing_lr(
            self.num_steps,
            lr=self.lr,
            warmup_iters=self.warmup_iters,
            decay_iters=self.decay_iters,
            style=self.style,
            min_lr=self.min_lr,
        )
        return [rate for _ in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self, step_num: int | None = None, **_: Any) -> None:
        """Advance to ``step_num`` (default: one more step) and write the rate into the optimizer."""
        self.num_steps = self.num_steps + 1 if step_num is None else int(step_num)
        for group, rate in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = rate

    def state_dict(self) -> dict[str, Any]:
        return {
            "start_lr": self.lr,
            "warmup_iter": self.warmup_iters,
            "num_iters": self.num_steps,
            "decay_style": self.style,
            "end_iter": self.decay_iters,
            "min_lr": self.min_lr,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position in the schedule; the rates themselves come from the current config.

        As in the reference (``use_checkpoint_lr_scheduler``), the step count is taken from the
        checkpoint; ``lr``/``warmup``/``decay`` stay as configured so a fine-tune can change them.
        """
        self.step(int(state["num_iters"]))
