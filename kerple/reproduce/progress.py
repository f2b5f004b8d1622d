"""The progress line of a reproduction: where the training stands, its speed, and the time still needed.

The remaining time counts the steps left in every run at the current run's step time (read from the
trainer's own progress lines), plus one evaluation per run not yet evaluated at the mean of the
evaluations measured so far. Start-up, compilation and checkpoint writing of later chunks are not in
it, so it is a lower bound for the wall time and a fair estimate for GPU time.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

from kerple.training.monitor import format_duration

STEP_LINE = re.compile(r"step\s+(\d+)/(\d+)")
TOKENS_PER_S = re.compile(r"([\d,]+) tok/s")
MS_PER_STEP = re.compile(r"(\d+) ms/step")


@dataclass
class Progress:
    """Training steps done per run, the latest step time, and measured evaluation times."""

    steps: int
    pos_embs: tuple[str, ...]
    done: dict[str, int] = field(default_factory=dict)
    evaluated: set[str] = field(default_factory=set)
    eval_seconds: list[float] = field(default_factory=list)
    seconds_per_step: float | None = None
    tokens_per_s: float | None = None
    current: str | None = None
    deadline: float | None = None
    every_s: float = 30.0
    _last_print: float = -math.inf

    def observe(self, pos_emb: str, line: str) -> bool:
        """Read one trainer line of ``pos_emb``; True when it was a step line."""
        match = STEP_LINE.search(line)
        if not match:
            return False
        self.current = pos_emb
        self.done[pos_emb] = int(match.group(1))
        speed, step_time = TOKENS_PER_S.search(line), MS_PER_STEP.search(line)
        if speed:
            self.tokens_per_s = float(speed.group(1).replace(",", ""))
        if step_time:
            self.seconds_per_step = int(step_time.group(1)) / 1000.0
        return True

    def remaining_seconds(self) -> float | None:
        """Training plus evaluation time still needed; ``None`` before any step time is known."""
        if self.seconds_per_step is None:
            return None
        steps_left = sum(self.steps - min(self.done.get(name, 0), self.steps) for name in self.pos_embs)
        evals_left = len([name for name in self.pos_embs if name not in self.evaluated])
        per_eval = sum(self.eval_seconds) / len(self.eval_seconds) if self.eval_seconds else 0.0
        return steps_left * self.seconds_per_step + evals_left * per_eval

    def line(self, now: float | None = None) -> str:
        """``progress: kerple_log step 1,200/36,622 | all runs 3.3% ... | ETA ...``."""
        now = time.monotonic() if now is None else now
        total = self.steps * len(self.pos_embs)
        done = sum(min(self.done.get(name, 0), self.steps) for name in self.pos_embs)
        parts = []
        if self.current is not None:
            parts.append(f"{self.current} step {self.done.get(self.current, 0):,}/{self.steps:,}")
        parts.append(f"all runs {done:,}/{total:,} steps ({100.0 * done / max(total, 1):.1f}%), "
                     f"{len(self.evaluated)}/{len(self.pos_embs)} evaluated")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s")
        remaining = self.remaining_seconds()
        parts.append("ETA " + (format_duration(remaining) if remaining is not None else "? (no step timed yet)")
                     + ("" if self.eval_seconds or remaining is None else " + evaluation"))
        if self.deadline is not None:
            parts.append(f"this chunk ends in {format_duration(max(self.deadline - now, 0.0))}")
        return "progress: " + " | ".join(parts)

    def due(self, now: float | None = None) -> bool:
        """True at most once every ``every_s`` seconds (then the caller prints :meth:`line`)."""
        now = time.monotonic() if now is None else now
        if now - self._last_print < self.every_s:
            return False
        self._last_print = now
        return True
