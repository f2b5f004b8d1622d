"""Where training metrics go: console lines, a JSONL file, TensorBoard and W&B (rank 0 only).

* console: one line every ``log_interval`` steps with the interval's mean loss (as GPT-NeoX,
  :mod:`kerple.training.interval`), lr, tokens/s, step time, ETA, the fp16 loss scale, the skipped
  steps and, for learnable positional embeddings, the ``metrics()`` statistics (the reference logs
  the KERPLE parameters every step, docs/reference-format.md §2);
* ``<log_dir>/metrics.jsonl``: every logged record, one JSON object per line, appended on resume;
  ``train/lm_loss`` is the loss of the record's own step (GPT-NeoX's TensorBoard ``train/lm_loss``),
  ``train/lm_loss_interval_mean`` the console's mean over the ``train/interval_steps`` steps since the
  previous record (less ``train/interval_skipped_steps``);
* TensorBoard (``torch.utils.tensorboard``) under ``tensorboard_dir`` when set;
* W&B when ``use_wandb`` is true; ``WANDB_MODE=offline`` (the default here) needs no network.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Monitor:
    """Fan-out of metric records; every method is a no-op on ranks other than the main one."""

    def __init__(
        self,
        *,
        enabled: bool,
        log_dir: str | None,
        tensorboard_dir: str | None = None,
        use_wandb: bool = False,
        wandb_project: str | None = None,
        run_config: dict[str, Any] | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self._jsonl: TextIO | None = None
        self._tensorboard: Any = None
        self._wandb: Any = None
        if not enabled:
            return
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self._jsonl = open(Path(log_dir) / "metrics.jsonl", "a", encoding="utf-8")
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(tensorboard_dir))
        if use_wandb:
            self._wandb = self._start_wandb(wandb_project, log_dir, run_config)

    def _start_wandb(self, project: str | None, log_dir: str | None, run_config: dict[str, Any] | None) -> Any:
        try:
            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")
            return wandb.init(project=project or "kerple", dir=log_dir or ".", config=run_config or {}, reinit=True)
        except Exception as err:  # W&B must never stop a training run
            self.print(f"warning: W&B disabled ({type(err).__name__}: {err})")
            return None

    def print(self, line: str) -> None:
        if self.enabled:
            print(line, file=self.stream, flush=True)

    def record(self, step: int, metrics: dict[str, float], prefix: str) -> None:
        """Write ``metrics`` (names without prefix) for ``step`` to JSONL, TensorBoard and W&B."""
        if not self.enabled:
            return
        named = {f"{prefix}/{key}": value for key, value in metrics.items()}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": step, "time": time.time(), **named}) + "\n")
            self._jsonl.flush()
        if self._tensorboard is not None:
            for key, value in named.items():
                self._tensorboard.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(named, step=step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def loss_scale(engine: Any) -> float | None:
    """The fp16 loss scale of DeepSpeed's optimizer (its ``loss_scale``: fp16 and ZeRO optimizers alike),
    ``None`` where the optimizer scales no loss."""
    value = getattr(engine.optimizer, "loss_scale", None)
    return None if value is None else float(value)


def progress_line(
    *, step: int, total: int, loss: float | None, lr: float, tokens_per_s: float, step_time: float,
    eta: float, skipped: int, grad_norm: float | None, positional: dict[str, float],
    interval_skipped: int = 0, interval_nan: int = 0, loss_scale: float | None = None,
) -> str:
    """One console line; positional statistics are summarised as ``name mean[min,max]``.

    ``loss`` is the interval's mean (``None``: every step of it was skipped); ``interval_skipped`` and
    ``interval_nan`` are GPT-NeoX's "number of skipped/nan iterations" since the last line, ``skipped``
    the run's total; ``loss_scale`` is printed for fp16, as GPT-NeoX does.
    """
    parts = [
        f"step {step:>6}/{total}",
        f"loss {loss:.6f}" if loss is not None else "loss - (every step skipped)",
        f"lr {lr:.4e}",
        f"{tokens_per_s:,.0f} tok/s",
        f"{step_time * 1000:.0f} ms/step",
        f"ETA {format_duration(eta)}",
    ]
    if grad_norm is not None and math.isfinite(grad_norm):
        parts.append(f"grad-norm {grad_norm:.3f}")
    if loss_scale is not None:
        parts.append(f"loss-scale {loss_scale:g}")
    if skipped or interval_skipped:
        parts.append(f"skipped {interval_skipped} ({skipped} in all)")
    if interval_nan:
        parts.append(f"nan {interval_nan}")
    names = sorted({key.rsplit("/", 1)[0] for key in positional})
    for name in names:
        mean, low, high = (positional.get(f"{name}/{s}") for s in ("mean", "min", "max"))
        if mean is not None:
            parts.append(f"{name} {mean:.3f}[{low:.3f},{high:.3f}]")
    return " | ".join(parts)
