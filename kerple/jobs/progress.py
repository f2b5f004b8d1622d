"""Where a training run stands, read from its ``<log_dir>/metrics.jsonl`` (the trainer's own record,
:mod:`kerple.training.monitor`), never from the lines it prints."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerple.training.monitor import format_duration


class MetricsFollower:
    """The training records appended to ``path`` after this object was made (a resumed run appends to
    the file of its earlier chunks; those records are history, not progress)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = self.path.stat().st_size if self.path.is_file() else 0
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        """The training records (``train/...`` keys) written since the last call; a line still being
        written waits for the next call."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        new = [json.loads(line) for line in complete.decode("utf-8").splitlines() if line.strip()]
        new = [record for record in new if "train/lm_loss" in record]
        self.records += new
        return new

    @property
    def step(self) -> int | None:
        """The last step recorded, ``None`` before the first record."""
        return int(self.records[-1]["step"]) if self.records else None


@dataclass
class Progress:
    """The reproduction's progress line: training steps done per run, the latest step time, and measured
    evaluation times. Start-up, compilation and later chunks' checkpoint writing are not in its remaining
    time, so that is a lower bound for the wall time and a fair estimate for GPU time."""

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

    def observe(self, pos_emb: str, records: list[dict[str, Any]]) -> bool:
        """Take in ``pos_emb``'s new training records (:meth:`MetricsFollower.poll`); True when there were any."""
        if not records:
            return False
        last = records[-1]
        self.current, self.done[pos_emb] = pos_emb, int(last["step"])
        if math.isfinite(last.get("train/tokens_per_s", math.nan)):
            self.tokens_per_s = float(last["train/tokens_per_s"])
        if "train/step_time_s" in last:
            self.seconds_per_step = float(last["train/step_time_s"])
        return True

    def remaining_seconds(self) -> float | None:
        """The steps left in every run at the current step time, plus one evaluation per run not yet
        evaluated at the mean of those measured; ``None`` before any step time is known."""
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
