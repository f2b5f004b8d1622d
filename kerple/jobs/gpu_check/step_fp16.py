"""Step 6: fp16 with DeepSpeed's dynamic loss scaling skips an overflowing step, counts it, and
training goes on.

The 162M model on a synthetic corpus. The initial loss scale is the smallest power of two sure to
overflow fp16 on the first step (:func:`overflow_scale_power`); each overflow halves it once
(hysteresis 1), so after ``power - 14`` skipped steps it is 2^14, where every gradient entry below
4 fits fp16, and the run has ``RECOVERY_STEPS`` more. (A scale of 2^32, as before, needs about 16
halvings for an untrained model's gradients to fit, more steps than the check ran.) Checks: the
run reaches its last step, at least one and at most ``power - 14`` steps were skipped
(``TrainResult.skipped_steps``), and every logged loss is finite.
"""

from __future__ import annotations

import math

from kerple.jobs.gpu_check.context import StepContext, model_config
from kerple.measure.training import write_random_corpus

NAME = "fp16 dynamic loss scaling: overflow skipped and counted"
SEQ, MICRO_BATCH = 512, 4
RECOVERY_STEPS = 4


def overflow_scale_power(tokens_per_micro_batch: int) -> int:
    """The smallest loss-scale exponent sure to overflow fp16 on the first step.

    The loss is the mean cross entropy over the micro-batch's tokens, computed in fp32 from fp16
    logits, so the gradient reaching the fp16 logits is ``scale * (p - y) / tokens``; at the target
    token ``|p - y| = 1 - p_target >= 1/2`` for an untrained model (``p`` about ``1/V``). It exceeds
    fp16's largest value (65504 < 2^16) once ``scale > 2^17 * tokens``.
    """
    return 17 + math.ceil(math.log2(tokens_per_micro_batch))


def run(ctx: StepContext) -> None:
    from kerple.training.trainer import run_training

    ctx.require_cuda("DeepSpeed refuses fp16 on the CPU accelerator")
    power = overflow_scale_power(MICRO_BATCH * SEQ)
    steps = power - 14 + RECOVERY_STEPS
    fp16 = {"enabled": True, "type": "float16", "initial_scale_power": power, "loss_scale_window": 1000,
            "hysteresis": 1, "min_loss_scale": 1}
    corpus = ctx.work / "fp16" / "corpus"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    vocab = int(model_config(ctx.scale, "kerple_log").model.vocab_size)
    write_random_corpus(corpus, vocab, (steps + 2) * MICRO_BATCH * (SEQ + 1))
    cfg = model_config(
        ctx.scale, "kerple_log", fp16=fp16, data_path=str(corpus), split="100,0,0", seq_length=SEQ,
        max_position_embeddings=SEQ, train_micro_batch_size_per_gpu=MICRO_BATCH, gradient_accumulation_steps=1,
        train_iters=steps, lr_decay_iters=steps, save=None, load=None, eval_iters=0, log_interval=1,
        log_dir=None, tensorboard_dir=None, use_wandb=False, attention_impl="auto",
    )
    result = run_training(cfg)
    table = ctx.result.table("Losses", ["step", "loss"])
    table.rows += [[str(step), f"{loss:.4f}"] for step, loss in result.losses]
    checks = {
        f"reached step {steps} (got {result.iteration})": result.iteration == steps,
        f"1 <= skipped steps <= {power - 14} (got {result.skipped_steps})": 1 <= result.skipped_steps <= power - 14,
        "every loss finite": all(math.isfinite(loss) for _, loss in result.losses),
    }
    ctx.result.notes += [f"{'passed' if ok else 'FAILED'}: {text}" for text, ok in checks.items()]
    ctx.result.metrics = {"skipped_steps": result.skipped_steps, "initial_scale_power": power}
    ctx.result.status = "passed" if all(checks.values()) else "failed"
    ctx.result.reason = "; ".join(text for text, ok in checks.items() if not ok) or (
        f"{result.skipped_steps} of {steps} steps skipped by the loss scaler")
