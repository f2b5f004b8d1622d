"""Step 6: fp16 with DeepSpeed's dynamic loss scaling skips an overflowing step, counts it, and
training goes on.

The 162M model on a synthetic corpus with an initial loss scale of 2^32: the scaled gradients
overflow fp16 (max 65504) on the first step, so the scaler must skip that update and halve the
scale until the gradients fit. Checks: the run reaches its last step, at least one and fewer than
all steps were skipped (``TrainResult.skipped_steps``), and every logged loss is finite.
"""

from __future__ import annotations

import math

from benchmarks.gpu_check.context import StepContext, model_config
from benchmarks.train_throughput import write_random_corpus

NAME = "fp16 dynamic loss scaling: overflow skipped and counted"
FP16 = {"enabled": True, "type": "float16", "initial_scale_power": 32, "loss_scale_window": 1000,
        "hysteresis": 1, "min_loss_scale": 1}
SEQ, MICRO_BATCH = 512, 4


def run(ctx: StepContext) -> None:
    from kerple.training.trainer import run_training

    ctx.require_cuda("DeepSpeed refuses fp16 on the CPU accelerator")
    steps = ctx.scale.fp16_steps
    corpus = ctx.work / "fp16" / "corpus"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    vocab = int(model_config(ctx.scale, "kerple_log").model.vocab_size)
    write_random_corpus(corpus, vocab, (steps + 2) * MICRO_BATCH * (SEQ + 1))
    cfg = model_config(
        ctx.scale, "kerple_log", fp16=FP16, data_path=str(corpus), split="100,0,0", seq_length=SEQ,
        max_position_embeddings=SEQ, train_micro_batch_size_per_gpu=MICRO_BATCH, gradient_accumulation_steps=1,
        train_iters=steps, lr_decay_iters=steps, save=None, load=None, eval_iters=0, log_interval=1,
        log_dir=None, tensorboard_dir=None, use_wandb=False, attention_impl="auto",
    )
    result = run_training(cfg)
    table = ctx.result.table("Losses", ["step", "loss"])
    table.rows += [[str(step), f"{loss:.4f}"] for step, loss in result.losses]
    checks = {
        f"reached step {steps} (got {result.iteration})": result.iteration == steps,
        f"1 <= skipped steps < {steps} (got {result.skipped_steps})": 1 <= result.skipped_steps < steps,
        "every loss finite": all(math.isfinite(loss) for _, loss in result.losses),
    }
    ctx.result.notes += [f"{'passed' if ok else 'FAILED'}: {text}" for text, ok in checks.items()]
    ctx.result.metrics = {"skipped_steps": result.skipped_steps}
    ctx.result.status = "passed" if all(checks.values()) else "failed"
    ctx.result.reason = "; ".join(text for text, ok in checks.items() if not ok) or (
        f"{result.skipped_steps} of {steps} steps skipped by the loss scaler")
