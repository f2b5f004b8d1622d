"""Step 3: FlexAttention against eager at the 162M shape, per embedding, length and precision.

One model per precision, built once: each embedding is swapped in (``model.positional``) and the
same weights run with ``eager`` and with ``flex`` (``set_attention``), in training mode, on the same
batch of random tokens (2 sequences). Kernels compile once per (embedding, length, precision): the
model, its FlexAttention kernel and its block masks are reused across cases. Cases run bf16 first
(the precision that needs its own tile sizes), shorter lengths first; those the budget does not
reach are listed as left out. Compared: logits, the gradient of the loss with respect to the input
embeddings (the embedding stage's output), and the gradients of the positional parameters. Error
measure: ``max|x - reference| / max|reference|`` per tensor (the worst over positional parameters).

fp32: flex against eager, within ``FP32_TOLERANCE``. bf16 casts the model's weights as DeepSpeed's
bf16 mode does (the positional parameters stay fp32): flex and eager in bf16 are both measured
against eager in fp32 on the same rounded weights, shown as ``flex (eager)``, and flex passes when
its error is at most twice eager's plus bf16's machine epsilon (a KERPLE exponent's gradient sums
many cancelling terms: a fixed tolerance would judge rounding noise). Each row names the kernel
options flex ran with (:mod:`kerple.model.flex_options`).

On a CPU FlexAttention has no backward: logits are compared in evaluation mode, gradients are n/a,
and the unfused (uncompiled) FlexAttention is used to avoid minutes of compilation.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from kerple.jobs.gpu_check.context import StepContext, allow_recompiles, model_config

NAME = "correctness: FlexAttention vs eager"
FP32_TOLERANCE = 1e-3
BATCH = 2
COLUMNS = ["pos_emb", "length", "precision", "logits", "input-embedding grad", "positional grads", "kernel options",
           "result"]


def _relative(value: torch.Tensor | None, reference: torch.Tensor | None) -> float | None:
    if value is None or reference is None:
        return None
    reference = reference.float()
    return ((value.float() - reference).abs().max() / reference.abs().max().clamp_min(1e-30)).item()


def _run(model: Any, impl: str, tokens: torch.Tensor, grads: bool) -> dict[str, Any]:
    """Logits, input-embedding gradient and positional gradients of one forward (+ backward)."""
    captured: dict[str, torch.Tensor] = {}

    def keep(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.retain_grad()
        captured["embedded"] = output

    model.set_attention(impl)
    handle = model.embedding.register_forward_hook(keep)
    model.zero_grad(set_to_none=True)
    try:
        with torch.set_grad_enabled(grads), warnings.catch_warnings():  # CPU: the unfused flex on purpose
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
            logits = model(tokens[:, :-1])  # [b, s, V]
            if grads:
                F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).backward()
    finally:
        handle.remove()
    positional = {name: p.grad.detach().float().clone() for name, p in model.positional.named_parameters()
                  if p.grad is not None}
    return {"logits": logits.detach().float(), "input": captured["embedded"].grad, "positional": positional}


def _errors(result: dict[str, Any], reference: dict[str, Any]) -> list[float | None]:
    """Errors of logits, input-embedding gradient and the worst positional gradient. A positional
    parameter with a reference gradient and none here counts as an infinite error (compiled
    FlexAttention once left KERPLE's parameters without gradients, silently)."""
    errors = [_relative(result["logits"], reference["logits"]), _relative(result["input"], reference["input"])]
    positional = [math.inf if key not in result["positional"] else _relative(result["positional"][key], value)
                  for key, value in reference["positional"].items()]
    errors.append(max((e for e in positional if e is not None), default=None))
    return errors


def missing_gradients(result: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """Positional parameters with a gradient in ``reference`` and none in ``result``."""
    return [key for key in reference["positional"] if key not in result["positional"]]


def _cell(error: float | None, eager: float | None = None) -> str:
    if error is None:
        return "n/a"
    return f"{error:.2e}" if eager is None else f"{error:.2e} ({eager:.2e})"


class Models:
    """The model of each precision (and, for bf16, its fp32 copy on the rounded weights), built once."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx, self.max_length = ctx, max(ctx.scale.correctness_lengths)
        self._built: dict[str, tuple[Any, Any]] = {}

    def get(self, precision: str, name: str) -> tuple[Any, Any]:
        """(model, fp32 reference or ``None``) of ``precision`` with embedding ``name`` swapped in."""
        from kerple import positional
        from kerple.model import build_model

        cfg = model_config(self.ctx.scale, name, seq_length=self.max_length,
                           max_position_embeddings=self.max_length, attention_impl="eager")
        if precision not in self._built:
            torch.manual_seed(0)
            model = build_model(cfg, flex_compile=self.ctx.cuda).to(self.ctx.device)
            reference = None
            if precision == "bf16":
                model = model.to(torch.bfloat16)
                reference = copy.deepcopy(model).float()
            self._built[precision] = (model, reference)
        model, reference = self._built[precision]
        torch.manual_seed(0)
        embedding = positional.build(
            name, num_heads=int(cfg.model.num_attention_heads), head_dim=int(cfg.model.head_dim),
            hidden_size=int(cfg.model.hidden_size), max_positions=self.max_length,
            num_layers=int(cfg.model.num_layers), **cfg.positional.options(),
        ).to(self.ctx.device)  # float32 tensors stay float32 (PositionalEmbedding._apply)
        for target in (model, reference):
            if target is not None:
                target.set_attention("eager")
                target.positional = embedding
        return model, reference


def _compare(ctx: StepContext, models: Models, name: str, length: int, precision: str) -> list[str]:
    """One table row: errors of flex (and, in bf16, of eager) for this case."""
    model, reference_model = models.get(precision, name)
    grads = ctx.cuda  # FlexAttention has no CPU backward
    model.train(grads)
    generator = torch.Generator().manual_seed(length)
    tokens = torch.randint(0, model.vocab_size, (BATCH, length + 1), generator=generator).to(ctx.device)
    eager = _run(model, "eager", tokens, grads)
    flex = _run(model, "flex", tokens, grads)
    options = model._flex.last_options or "PyTorch's (CPU)"
    missing = missing_gradients(flex, eager)
    lost = f"no flex gradient for {', '.join(missing)} (eager has one)" if missing else ""
    if reference_model is None:
        errors = _errors(flex, eager)
        worst = max((e for e in errors if e is not None), default=0.0)
        verdict = lost or ("ok" if worst <= FP32_TOLERANCE else f"over tolerance {FP32_TOLERANCE:g}")
        return [name, str(length), precision, *map(_cell, errors), options, verdict]
    reference_model.train(grads)
    reference = _run(reference_model, "eager", tokens, grads)
    flex_errors, eager_errors = _errors(flex, reference), _errors(eager, reference)
    epsilon = torch.finfo(torch.bfloat16).eps
    worse = [f for f, e in zip(flex_errors, eager_errors) if f is not None and f > 2 * (e or 0.0) + epsilon]
    verdict = lost or ("ok" if not worse else "flex error over 2 x eager's + eps")
    return [name, str(length), precision, *map(_cell, flex_errors, eager_errors), options, verdict]


def _cases(ctx: StepContext) -> list[tuple[str, int, str]]:
    """(embedding, length, precision), bf16 first, shorter lengths first."""
    precisions = sorted(ctx.scale.correctness_dtypes, key=lambda precision: precision != "bf16")
    return [(name, length, precision) for precision in precisions
            for length in sorted(ctx.scale.correctness_lengths) for name in ctx.scale.embeddings]


def run(ctx: StepContext) -> None:
    allow_recompiles()
    table = ctx.result.table("max |x - reference| / max |reference| (bf16: flex (eager), reference eager fp32)",
                             COLUMNS)
    models, cases = Models(ctx), _cases(ctx)
    failed, skipped = 0, []
    for name, length, precision in cases:
        if ctx.out_of_time():
            table.rows.append([name, str(length), precision, "", "", "", "", "left out: step budget used up"])
            skipped.append(f"{name}/{length}/{precision}")
            continue
        try:
            row = _compare(ctx, models, name, length, precision)
        except Exception as error:  # one case's error is a finding; the others still run
            row = [name, str(length), precision, "", "", "", "", f"error: {type(error).__name__}: {str(error)[:300]}"]
        failed += row[-1] != "ok"
        table.rows.append(row)
        ctx.progress(" | ".join(row))
        if ctx.cuda:
            torch.cuda.empty_cache()
    ctx.result.notes.append(f"fp32 tolerance {FP32_TOLERANCE:g}; bf16: flex within 2 x eager's error + "
                            f"{torch.finfo(torch.bfloat16).eps:g}; batch {BATCH} random sequences")
    if not ctx.cuda:
        ctx.result.notes.append("CPU: logits only (no FlexAttention backward on CPU), unfused FlexAttention")
    if skipped:
        ctx.result.notes.append("left out for time: " + ", ".join(skipped))
    ctx.result.status = "failed" if failed else "passed"
    ctx.result.reason = f"{len(cases) - failed - len(skipped)} of {len(cases)} cases within tolerance" + (
        f"; {len(skipped)} left out for time" if skipped else "")
