"""Step 3: FlexAttention against eager at the 162M shape, per embedding, length and precision.

One model per (embedding, length, precision); the same weights run once with ``eager`` and once
with ``flex`` (``set_attention``), in training mode, on the same batch of random tokens (2
sequences). Compared: logits, the gradient of the loss with respect to the input embeddings (the
embedding stage's output), and the gradients of the positional parameters. bf16 casts the model's
weights as DeepSpeed's bf16 mode does (the positional parameters stay fp32). Error measure:
``max|flex - eager| / max|eager|`` per tensor (the worst over the positional parameters).

On a CPU FlexAttention has no backward: logits are compared in evaluation mode, gradients are n/a,
and the unfused (uncompiled) FlexAttention is used to avoid minutes of compilation.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gpu_check.context import StepContext, allow_recompiles, model_config

NAME = "correctness: FlexAttention vs eager"
TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}
BATCH = 2


def _relative(value: torch.Tensor | None, reference: torch.Tensor | None) -> float | None:
    if value is None or reference is None:
        return None
    reference = reference.float()
    return ((value.float() - reference).abs().max() / reference.abs().max().clamp_min(1e-30)).item()


def _run(model: Any, tokens: torch.Tensor, grads: bool) -> dict[str, Any]:
    """Logits, input-embedding gradient and positional gradients of one forward (+ backward)."""
    captured: dict[str, torch.Tensor] = {}

    def keep(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.retain_grad()
        captured["embedded"] = output

    handle = model.embedding.register_forward_hook(keep)
    model.zero_grad(set_to_none=True)
    try:
        with torch.set_grad_enabled(grads):
            logits = model(tokens[:, :-1])  # [b, s, V]
            if grads:
                F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
    finally:
        handle.remove()
    positional = {name: p.grad.detach().float().clone() for name, p in model.positional.named_parameters()
                  if p.grad is not None}
    return {"logits": logits.detach().float(), "input": captured["embedded"].grad, "positional": positional}


def _compare(ctx: StepContext, name: str, length: int, precision: str) -> list[str]:
    """One table row: errors of flex against eager for this case."""
    from kerple.model import build_model

    cfg = model_config(ctx.scale, name, seq_length=length, max_position_embeddings=length, attention_impl="eager")
    torch.manual_seed(0)
    model = build_model(cfg, flex_compile=ctx.cuda).to(ctx.device)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    grads = ctx.cuda  # FlexAttention has no CPU backward
    model.train(grads)
    generator = torch.Generator().manual_seed(length)
    tokens = torch.randint(0, int(cfg.model.vocab_size), (BATCH, length + 1), generator=generator).to(ctx.device)
    eager = _run(model, tokens, grads)
    model.set_attention("flex")
    with warnings.catch_warnings():  # on CPU the unfused FlexAttention is chosen on purpose
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        flex = _run(model, tokens, grads)
    errors = [_relative(flex["logits"], eager["logits"]), _relative(flex["input"], eager["input"])]
    positional = [_relative(flex["positional"].get(key), value) for key, value in eager["positional"].items()]
    errors.append(max((e for e in positional if e is not None), default=None))
    worst = max((e for e in errors if e is not None), default=0.0)
    verdict = "ok" if worst <= TOLERANCE[precision] else f"over tolerance {TOLERANCE[precision]:g}"
    cells = ["n/a" if e is None else f"{e:.2e}" for e in errors]
    return [name, str(length), precision, *cells, verdict]


def run(ctx: StepContext) -> None:
    allow_recompiles()
    table = ctx.result.table(
        "max |flex - eager| / max |eager|",
        ["pos_emb", "length", "precision", "logits", "input-embedding grad", "positional grads", "result"],
    )
    cases = [(name, length, precision) for precision in ctx.scale.correctness_dtypes
             for length in ctx.scale.correctness_lengths for name in ctx.scale.embeddings]
    failed, skipped = 0, 0
    for name, length, precision in cases:
        if ctx.out_of_time():
            table.rows.append([name, str(length), precision, "", "", "", "skipped: step budget used up"])
            skipped += 1
            continue
        try:
            row = _compare(ctx, name, length, precision)
        except Exception as error:  # one case's error is a finding; the others still run
            row = [name, str(length), precision, "", "", "", f"error: {type(error).__name__}: {str(error)[:150]}"]
        failed += row[-1] != "ok"
        table.rows.append(row)
        ctx.progress(" ".join(row))
        if ctx.cuda:
            torch.cuda.empty_cache()
    ctx.result.notes.append(f"tolerance (max-normalized error): {TOLERANCE}; batch {BATCH} random sequences")
    if not ctx.cuda:
        ctx.result.notes.append("CPU: logits only (no FlexAttention backward on CPU), unfused FlexAttention")
    ctx.result.status = "failed" if failed else "passed"
    ctx.result.reason = f"{len(cases) - failed - skipped} of {len(cases)} cases within tolerance" + (
        f"; {skipped} left out for time" if skipped else "")
