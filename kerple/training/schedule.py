"""Learning-rate schedule of GPT-NeoX's ``AnnealingLR`` (docs/reference-format.md §5).

The schedule is a function of the number of *completed optimizer steps* ``n``. With
``end = lr_decay_iters`` and ``warmup_iters = warmup * end`` (``warmup`` is a fraction):

* the step is first clamped: ``c = min(n, end - warmup_iters)``, so the rate stops changing after
  ``end - warmup_iters`` steps;
* warm-up: for ``n <= warmup_iters`` the rate is ``lr * c / warmup_iters`` (the very first step
  runs at 0, exactly as in the reference);
* afterwards, with ``m = c - warmup_iters``:
  ``linear``      ``lr * (end - m) / end``;
  ``cosine``      ``lr / 2 * (cos(pi * m / end) + 1)``;
  ``exponential`` ``lr * exp(-0.693 * m / end)`` (0.693 ~ ln 2);
  ``constant``    ``lr``;
  every style divides by ``end``, not ``end - warmup_iters``, so the curve ends above zero;
* the result is floored at ``min_lr``.

DeepSpeed calls :meth:`AnnealingLR.step` after every optimizer step that was not skipped (an fp16
overflow does not advance the schedule), as it does for the reference.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kerple.config.errors import ConfigError

DECAY_STYLES = ("linear", "cosine", "exponential", "constant")

_CHECKED = (
    ("start_lr", "lr", "lr"),
    ("min_lr", "min_lr", "min_lr"),
    ("end_iter", "decay_iters", "lr_decay_iters"),
    ("warmup_iter", "warmup_iters", "warmup"),
    ("decay_style", "style", "lr_decay_style"),
)
"""Schedule values a checkpoint holds (its key, this class's attribute, the config key that sets it),
in the reference's order but for the warm-up, a fraction of the decay length: compared after it."""


def annealing_lr(
    step: int, *, lr: float, warmup_iters: float, decay_iters: int, style: str, min_lr: float = 0.0
) -> float:
    """The learning rate after ``step`` completed optimizer steps (docs/reference-format.md §5)."""
    if style not in DECAY_STYLES:
        raise ValueError(f"lr_decay_style {style!r} is not one of {', '.join(DECAY_STYLES)}")
    end = max(int(decay_iters), 1)
    clamped = min(step, end - warmup_iters)
    if warmup_iters > 0 and step <= warmup_iters:
        return lr * clamped / warmup_iters
    since_warmup = clamped - warmup_iters
    if style == "linear":
        rate = lr * (end - since_warmup) / end
    elif style == "cosine":
        rate = lr / 2.0 * (math.cos(math.pi * since_warmup / end) + 1.0)
    elif style == "exponential":
        rate = lr * math.exp(-0.693 * since_warmup / end)
    else:
        rate = lr
    return max(rate, min_lr)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


class AnnealingLR:
    """Sets ``lr`` on every parameter group of ``optimizer`` following :func:`annealing_lr`.

    It has the ``step()`` / ``state_dict()`` / ``load_state_dict()`` / ``get_lr()`` interface that
    ``deepspeed.initialize(lr_scheduler=...)`` expects. ``last_step`` is the number of optimizer
    steps already taken (non-zero when resuming).

    ``use_checkpoint_lr_scheduler`` and ``override_lr_scheduler`` decide what
    :meth:`load_state_dict` does with the schedule values a checkpoint holds (the reference's
    options of the same names, see there). Callers pass ``cfg.lr_schedule``'s values; the class
    defaults (override) keep the configured values, the behaviour of callers that predate the
    options.
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
        use_checkpoint_lr_scheduler: bool = False,
        override_lr_scheduler: bool = True,
    ) -> None:
        if style not in DECAY_STYLES:
            raise ValueError(f"lr_decay_style {style!r} is not one of {', '.join(DECAY_STYLES)}")
        if not 0.0 <= warmup <= 1.0:
            raise ValueError(f"warmup is a fraction of lr_decay_iters, got {warmup}")
        if use_checkpoint_lr_scheduler and override_lr_scheduler:
            raise ValueError("use_checkpoint_lr_scheduler and override_lr_scheduler cannot both be set")
        self.optimizer = optimizer
        self.lr = float(lr)
        self.warmup_iters = float(warmup) * int(decay_iters)
        self.decay_iters = int(decay_iters)
        self.style = style
        self.min_lr = float(min_lr)
        self.use_checkpoint_lr_scheduler = use_checkpoint_lr_scheduler
        self.override_lr_scheduler = override_lr_scheduler
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

    def _differences(self, state: dict[str, Any]) -> list[tuple[str, str]]:
        """``(config key, "key: checkpoint A, config B")`` for every schedule value the config sets otherwise, by its config
        key; the warm-up as the fraction of the decay length that ``warmup`` is (a new decay length
        alone changes its step count, not the setting)."""
        differences = []
        for saved_key, attribute, key in _CHECKED:
            saved, configured = state[saved_key], getattr(self, attribute)
            if saved_key == "warmup_iter":
                saved, configured = saved / max(int(state["end_iter"]), 1), configured / max(self.decay_iters, 1)
            if saved != configured and not (isinstance(saved, float) and math.isclose(saved, configured)):
                unset = " (train_iters when lr_decay_iters is unset)" if key == "lr_decay_iters" else ""
                differences.append((key, f"{key}: checkpoint {_shown(saved)}, config {_shown(configured)}{unset}"))
        return differences

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position in the schedule and, as the options say, its values.

        The step count always comes from the checkpoint. The values (``lr``, ``min_lr``, warm-up,
        schedule length, decay style): with ``override_lr_scheduler`` the configured ones stay;
        with ``use_checkpoint_lr_scheduler`` the checkpoint's replace them; with neither (the
        reference's default) they must be equal, else :class:`ConfigError`.
        """
        if not self.override_lr_scheduler:
            differences = self._differences(state)
            if differences and not self.use_checkpoint_lr_scheduler:
                keys = tuple(key for key, _ in differences)
                raise ConfigError(
                    f"the checkpoint's schedule differs from the config's: {'; '.join(text for _, text in differences)}. "
                    "Set use_checkpoint_lr_scheduler: true to continue the checkpoint's schedule, or "
                    "override_lr_scheduler: true to use the configured one",
                    key=keys if len(keys) > 1 else keys[0],
                )
            for saved_key, attribute, _ in _CHECKED:
                setattr(self, attribute, type(getattr(self, attribute))(state[saved_key]))
        self.step(int(state["num_iters"]))
