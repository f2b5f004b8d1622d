"""The losses one log line reports: the mean over the log interval, as GPT-NeoX prints it.

GPT-NeoX's ``training_log`` (megatron/logging.py) adds each iteration's ``lm_loss`` to a running
total unless DeepSpeed's fp16 loss scaler skipped the iteration, counts the skipped iterations and,
among them, those whose loss was not finite ("nan iterations"), and every ``log_interval``-th
iteration prints ``total / max(1, log_interval - skipped)`` with both counts, then starts over.

The per-step losses reach this class as host floats from :meth:`Trainer.read_losses`, which reads
them (one synchronization) only at log and save steps: keeping the interval's total adds no host
work per step. Two deliberate differences, both where GPT-NeoX's divisor assumes a whole interval:
the mean here divides by the steps actually added, so a run resumed mid-interval (or the last,
shorter interval) reports the mean of the steps it ran where GPT-NeoX would divide, say, a 5-step
total by 10; and an interval whose every step was skipped has no mean (GPT-NeoX prints 0).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class LossInterval:
    """Running totals of the steps since the last ``log_interval`` line."""

    total: float = 0.0
    counted: int = 0
    """Steps whose loss is in ``total`` (not skipped)."""
    skipped: int = 0
    """Steps the fp16 loss scaler skipped (an overflow): their loss is left out of the mean."""
    nan_skipped: int = 0
    """Skipped steps whose loss itself was not finite (GPT-NeoX's "nan iterations")."""
    _skipped_steps: set[int] = field(default_factory=set)

    def mark_skipped(self, step: int) -> None:
        """Say that ``step`` was skipped; its loss, read later, is then counted as skipped."""
        self._skipped_steps.add(step)

    def add(self, losses: Iterable[tuple[int, float]]) -> None:
        """Take in ``(step, loss)`` pairs as :meth:`Trainer.read_losses` returns them."""
        for step, value in losses:
            if step in self._skipped_steps:
                self._skipped_steps.discard(step)
                self.skipped += 1
                self.nan_skipped += not math.isfinite(value)
            else:
                self.total += value
                self.counted += 1

    @property
    def steps(self) -> int:
        """Steps taken in this interval, skipped ones included."""
        return self.counted + self.skipped

    def mean(self) -> float | None:
        """The mean loss of the steps not skipped; ``None`` when every step was skipped."""
        return self.total / self.counted if self.counted else None

    def reset(self) -> None:
        """Start the next interval (steps marked skipped but not yet read stay marked)."""
        self.total, self.counted, self.skipped, self.nan_skipped = 0.0, 0, 0, 0
