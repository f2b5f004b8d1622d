"""Peak memory and tokens/s of evaluation (forward + chunked LM head and loss, no grad, batch 1) per
attention implementation and length: the driver.

Every (implementation, length) runs in a fresh interpreter (:mod:`kerple.measure.eval_worker`) so
that one run's peak cannot hide in another's. :func:`measure_all` walks the lengths upwards per
implementation and skips a cell (saying why) when its estimated peak (:func:`estimate_bytes`)
exceeds the memory budget, when a shorter length of the same implementation was skipped or failed,
or when its time extrapolated from the previous length exceeds ``max_seconds``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TINY_MODEL = {
    "num_layers": 2,
    "hidden_size": 192,
    "num_attention_heads": 12,
    "seq_length": 512,
    "vocab_size": 512,
    "make_vocab_size_divisible_by": 128,
}
SCORE_COPIES = {"eager": 5, "sdpa": 2, "flex": 0, "triton": 0}  # fp32 [H, L, L] tensors alive at the peak
# glibc returns freed blocks to the OS, so a warm-up's freed memory cannot be reused unseen
WORKER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}


@dataclass
class EvalSettings:
    """What every cell shares: model YAMLs (none: :data:`TINY_MODEL`), embedding, implementations in
    order, positions per LM-head/loss chunk, device (``cpu``, ``cuda``, ``cuda:1``) and the time limit."""

    configs: list[str]
    pos_emb: str
    impls: Sequence[str]
    chunk_size: int
    device: str
    max_seconds: float


@dataclass
class EvalCell:
    """One (implementation, length) cell: ``peak_bytes``/``seconds``/``loss`` are None when not run."""

    impl: str
    length: int
    estimate_bytes: int
    peak_bytes: int | None = None
    seconds: float | None = None
    loss: float | None = None
    note: str = ""

    @property
    def tokens_per_second(self) -> float | None:
        return None if self.seconds is None else self.length / self.seconds


def load_model_config(config_files: list[str], pos_emb: str) -> Any:
    """The measured model's :class:`kerple.config.Config`: ``config_files`` or the tiny CPU model."""
    from kerple.config import load_config

    overrides = {"pos_emb": pos_emb, "train_iters": 0, "attention_impl": "eager"}
    if not config_files:
        overrides.update(TINY_MODEL)
    return load_config(config_files, overrides)


def estimate_bytes(impl: str, length: int, cfg: Any, chunk_size: int) -> int:
    """Estimated peak growth of one no-grad evaluation of batch 1 at ``length`` tokens.

    Activations: ~8 hidden-sized plus two 4h-sized fp32 tensors per token (one layer at a time);
    the loss: three fp32 ``[chunk, V]`` tensors; distance tables ``[H, L]``; and for eager/sdpa
    ``SCORE_COPIES[impl]`` fp32 ``[H, L, L]`` tensors plus the int64 distance and bool mask ``[L, L]``.
    """
    model = cfg.model
    hidden, heads, vocab = model.hidden_size, model.num_attention_heads, model.padded_vocab_size
    activations = 4 * length * (8 * hidden + 2 * 4 * hidden)
    logits = 3 * 4 * min(chunk_size, length) * vocab
    tables = 2 * 4 * heads * length
    quadratic = 0 if SCORE_COPIES[impl] == 0 else SCORE_COPIES[impl] * 4 * heads * length**2 + 9 * length**2
    return activations + logits + tables + quadratic


def _worker_environment() -> dict[str, str]:
    """This environment and :data:`WORKER_MALLOC`, with the folder holding this ``kerple`` first on
    ``PYTHONPATH`` so that the worker imports the same code however the parent found it; the working
    folder is kept off ``sys.path`` (``PYTHONSAFEPATH``, Python >= 3.11), where another checkout's
    ``kerple`` could sit."""
    source = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1", **WORKER_MALLOC}


def run_one(settings: EvalSettings, impl: str, length: int, timeout: float) -> dict:
    """Measure ``(impl, length)`` in a fresh interpreter; its JSON result or ``{"error": ...}``."""
    command = [sys.executable, "-m", "kerple.measure.eval_worker", "--impl", impl, "--length", str(length),
               "--device", settings.device, "--pos-emb", settings.pos_emb, "--chunk-size", str(settings.chunk_size)]
    command += [arg for path in settings.configs for arg in ("--config", path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_worker_environment())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        killed = " (killed: out of memory?)" if done.returncode < 0 else ""
        return {"error": f"exit {done.returncode}{killed}: {last[:120]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_all(settings: EvalSettings, cfg: Any, lengths: list[int], budget: int) -> list[EvalCell]:
    """Every (impl, length) in increasing length, skipping what cannot fit or finish (module docstring);
    a line per measured or failed cell on stderr."""
    results = []
    for impl in settings.impls:
        blocked, previous = "", None
        for length in lengths:
            cell = EvalCell(impl, length, estimate_bytes(impl, length, cfg, settings.chunk_size))
            results.append(cell)
            if blocked:
                cell.note = blocked
            elif cell.estimate_bytes > budget:
                cell.note = f"skipped: estimated {cell.estimate_bytes / 2**30:.1f} GiB > budget {budget / 2**30:.1f} GiB"
            elif previous is not None and projected_seconds(previous, length) > settings.max_seconds:
                cell.note = (f"skipped: projected {projected_seconds(previous, length):.0f} s "
                             f"> --max-seconds {settings.max_seconds:.0f}")
            if cell.note:
                blocked = blocked or "skipped: a shorter length was skipped or failed"
                continue
            outcome = run_one(settings, impl, length, timeout=settings.max_seconds * 3 + 120)
            if "error" in outcome:
                cell.note, blocked = outcome["error"], "skipped: a shorter length failed"
            else:
                cell.peak_bytes, cell.seconds, cell.loss = outcome["peak_bytes"], outcome["seconds"], outcome["loss"]
                cell.note = outcome["method"].removeprefix("VmHWM").removeprefix("; ")
                previous = cell
            print(f"  {impl:5s} {length:6d}: {cell_text(cell)}", file=sys.stderr, flush=True)
    return results


def projected_seconds(previous: EvalCell, length: int) -> float:
    """The attention work grows as L² for every kernel (flex skips only the masked half)."""
    return previous.seconds * (length / previous.length) ** 2


def cell_text(cell: EvalCell) -> str:
    """One cell as the progress line shows it: its figures, or why it has none."""
    if cell.peak_bytes is None:
        return cell.note
    return f"{cell.peak_bytes / 2**20:.1f} MiB, {cell.tokens_per_second:.0f} tok/s, loss {cell.loss:.4f}"
