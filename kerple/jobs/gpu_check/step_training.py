"""Step 5: a 300-step 162M ``kerple_log`` run in bf16 on the embedded data, then exact resumption.

Data: ``prepare_data.py stdlib`` (the Python standard library, offline) with a byte-level BPE
trained on it (the 20B tokenizer would need a download), limited to the first documents; prepared
once under the work folder. Three runs through ``run_training``: (A) 300 steps uninterrupted,
checkpoints at 150 and 300; (B) the first 150 steps; (C) B resumed from its step-150 checkpoint to
300 (the LR schedule spans 300 steps in all three). Checks: A's loss falls (mean of its last tenth
at least ``MIN_DROP`` below its first tenth), C starts at step 151, and C's losses equal A's
(bitwise on a CPU; within ``CUDA_TOLERANCE`` relative on CUDA, where kernels such as the
FlexAttention backward accumulate gradients in a nondeterministic order).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from kerple.jobs.gpu_check.context import REPO, StepContext, model_config
from kerple.jobs.process import run_child

NAME = "kerple_log training: loss falls, checkpoint, exact resume"
MIN_DROP = 0.10
CUDA_TOLERANCE = 1e-2


def prepare_data(ctx: StepContext) -> dict[str, Any]:
    """Config overrides for the embedded corpus (prepared on first use)."""
    from tokenizers import Tokenizer

    scale = ctx.scale
    folder = ctx.work / "data" / f"stdlib-bpe{scale.train_vocab}-{scale.train_documents}"
    command = [sys.executable, str(REPO / "prepare_data.py"), "stdlib", "-d", str(folder), "--train-tokenizer",
               str(scale.train_vocab), "--limit", str(scale.train_documents), "--workers",
               str(max(1, min(8, (os.cpu_count() or 2) - 1))), "--quiet"]
    done = run_child(command, capture=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if not done.ok:
        raise RuntimeError(f"prepare_data.py failed ({done.returncode}): {done.last_line()[-400:]}")
    prefix = folder / "stdlib" / "stdlib_text_document"
    info = json.loads(Path(f"{prefix}.info.json").read_text())
    vocab_file = info["tokenizer"]["vocab_file"]
    return {"data_path": str(prefix), "split": info["split"], "tokenizer_type": "HFTokenizer",
            "vocab_file": vocab_file, "vocab_size": Tokenizer.from_file(vocab_file).get_vocab_size()}


def _train(ctx: StepContext, data: dict[str, Any], save: Path, iterations: int, resume: bool) -> Any:
    from kerple.training.trainer import run_training

    scale, total = ctx.scale, ctx.scale.train_steps
    cfg = model_config(
        scale, "kerple_log", **data, seq_length=scale.train_seq, max_position_embeddings=scale.train_seq,
        train_micro_batch_size_per_gpu=scale.train_micro_batch, gradient_accumulation_steps=1,
        train_iters=iterations, lr_decay_iters=total, save=str(save), load=str(save) if resume else None,
        save_interval=total // 2, keep_last_n_checkpoints=None, eval_interval=total, eval_iters=0,
        log_interval=max(total // 6, 1), log_dir=None, tensorboard_dir=None, use_wandb=False, attention_impl="auto",
        **scale.train_overrides,
    )
    return run_training(cfg)


def _losses(result: Any) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in result.losses}


def run(ctx: StepContext) -> None:
    data = prepare_data(ctx)
    ctx.progress(f"data ready: vocab {data['vocab_size']}")
    total, half = ctx.scale.train_steps, ctx.scale.train_steps // 2
    runs = ctx.work / "training"
    shutil.rmtree(runs, ignore_errors=True)
    full = _losses(_train(ctx, data, runs / "uninterrupted", total, resume=False))
    ctx.progress(f"uninterrupted run: loss {full[1]:.3f} -> {full[total]:.3f}")
    _train(ctx, data, runs / "resumed", half, resume=False)
    ctx.progress(f"first {half} steps done; resuming")
    resumed = _losses(_train(ctx, data, runs / "resumed", total, resume=True))

    tenth = max(total // 10, 1)
    first = sum(full[s] for s in range(1, tenth + 1)) / tenth
    last = sum(full[s] for s in range(total - tenth + 1, total + 1)) / tenth
    differences = {s: abs(resumed[s] - full[s]) / abs(full[s]) for s in resumed}
    worst = max(differences.values(), default=math.inf)
    tolerance = CUDA_TOLERANCE if ctx.cuda else 0.0
    checks = {
        f"loss falls by >= {MIN_DROP:.0%} (first tenth {first:.4f}, last tenth {last:.4f})": last <= first * (1 - MIN_DROP),
        f"resume starts at step {half + 1} (got {min(resumed, default=0)})": min(resumed, default=0) == half + 1,
        f"resumed losses match (max relative difference {worst:.2e}, tolerance {tolerance:g})": worst <= tolerance,
    }
    table = ctx.result.table("Losses after the resume point", ["step", "uninterrupted", "resumed", "relative difference"])
    for step in sorted(resumed)[:: max(len(resumed) // 10, 1)]:
        table.rows.append([str(step), f"{full[step]:.6f}", f"{resumed[step]:.6f}", f"{differences[step]:.2e}"])
    ctx.result.notes += [f"{'passed' if ok else 'FAILED'}: {text}" for text, ok in checks.items()]
    ctx.result.notes.append(f"bitwise equal after resume: {worst == 0.0}")
    ctx.result.metrics = {"first_tenth_loss": first, "last_tenth_loss": last, "max_resume_difference": worst}
    ctx.result.status = "passed" if all(checks.values()) else "failed"
    ctx.result.reason = "; ".join(text for text, ok in checks.items() if not ok) or (
        f"loss {first:.3f} -> {last:.3f}; resume max relative difference {worst:.1e}")
