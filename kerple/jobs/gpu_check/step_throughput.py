"""Step 4: training throughput of the 162M config per embedding x attention kernel x ``compile``.

A real ``Trainer`` (DeepSpeed engine, bf16, fused AdamW) per embedding and ``compile`` setting, on
a synthetic corpus; the kernel is switched with ``set_attention`` between measurements, so each
(embedding, compile) builds and compiles once per kernel. Per cell: ``--warmup`` untimed steps, then
the median of timed ``Trainer.train_step`` calls (:mod:`kerple.measure.training`). Cells run in
priority order so that the budget is spent on what matters most: without compile, the kernel
``auto`` picks, then the other kernels; then the same with compile. Cells the budget does not reach
are listed as left out.

An embedding with a closed-form logit term is also measured with ``flex`` gathering its distance
table instead (``flex (table)``: ``FlexAttentionKernel.closed_form = False``), which shows what the
closed form's per-head gradient scatter costs or saves against the table's.

MFU = tokens/s x FLOPs per token / the peak measured at the start of this step (bf16 matmul), with
FLOPs per token = 6·N + 12·L·h·s (PaLM, Appendix B): N = parameters in matmuls (the word-embedding
table excluded, the LM head included), L layers, h hidden size, s sequence length; the attention
term counts the full s x s products although causal kernels skip about half.

Validity: after a kernel's warm-up and timed steps the positional embedding's trainable parameters
must have changed; a kernel that trains without moving them (compiled FlexAttention once
gave KERPLE's parameters no gradient) is marked invalid, left out of the summary, and fails the step.

Targets (CUDA; each best setting against ``none``'s best): ``kerple_log`` at least
``TARGET_TOKENS_PER_S`` tokens/s on an H100 and ``TARGET_MFU`` MFU, within ``KERPLE_LOG_RATIO`` of
``none``; every embedding with a logit term within ``BIAS_RATIO`` of ``none``. A missed target
fails the step.
"""

from __future__ import annotations

from typing import Any

import torch

from kerple.jobs.gpu_check.context import REPO, StepContext, allow_recompiles, model_config
from kerple.measure.device import measure_peak_flops, peak_bytes, release
from kerple.measure.training import build_trainer, flops_per_token, timed_step, write_random_corpus

NAME = "training throughput per embedding, kernel and compile"
COLUMNS = ["pos_emb", "compile", "attention", "step (ms)", "tokens/s", "MFU", "peak memory (GiB)", "note"]
TABLE_VARIANT = "flex (table)"
TARGET_TOKENS_PER_S, TARGET_MFU = 450_000, 0.50
KERPLE_LOG_RATIO, BIAS_RATIO = 0.95, 0.90


def _cell(ctx: StepContext, trainer: Any, peak: float, tokens: int) -> tuple[float, float, float]:
    """(seconds per step, MFU, peak bytes) of the trainer's current kernel."""
    for _ in range(ctx.scale.throughput_warmup):
        trainer.train_step()
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    times = sorted(timed_step(trainer, ctx.device) for _ in range(ctx.scale.throughput_steps))
    seconds = times[len(times) // 2]
    model, cfg = trainer.model, trainer.cfg
    per_token = flops_per_token(model, int(cfg.model.num_layers), int(cfg.model.hidden_size), ctx.scale.throughput_seq)
    return seconds, tokens / seconds * per_token / peak, peak_bytes(ctx.device)


def _setting(ctx: StepContext, name: str, compile_: bool, build: Any, peak: float, results: dict) -> list[list[str]]:
    """All kernels of one (embedding, compile) setting, the ``auto`` choice first."""
    flag = "on" if compile_ else "off"
    if compile_ and not ctx.cuda:
        return [[name, flag, "all", "", "", "", "", "skipped: compile is measured on CUDA only"]]
    trainer, rows = None, []
    try:
        trainer = build(name, compile_)
        choice = trainer.model.resolve_attention_impl(ctx.device.type, True, ctx.scale.throughput_seq)
        impls = [choice] + [i for i in ctx.scale.throughput_impls if i != choice]
        if ctx.scale.table_variant and trainer.model.positional.logit_term() is not None and "flex" in impls:
            impls.append(TABLE_VARIANT)
        for impl in impls:
            label = f"{impl} (auto)" if impl == choice else impl
            note, trainer = _measure_kernel(ctx, trainer, impl, peak, results, (name, compile_, impl == choice), build)
            rows.append([name, flag, label, *note])
            ctx.progress(" | ".join(rows[-1]))
    except Exception as error:  # the trainer could not be built: say so and go on
        rows.append([name, flag, "all", "", "", "", "", f"error: {type(error).__name__}: {str(error)[:150]}"])
    finally:
        if trainer is not None:
            trainer.close()
        release(ctx.device)
    return rows


def _measure_kernel(ctx: StepContext, trainer: Any, impl: str, peak: float, results: dict, key: tuple,
                    build: Any) -> tuple[list[str], Any]:
    """The five measured cells (or a note) for ``impl``, and the trainer to go on with (a new one
    after an error, which can leave the engine mid-step)."""
    from kerple.model.attention import unsupported_reason

    name, compile_, chosen = key
    model = trainer.model
    kernel = "flex" if impl == TABLE_VARIANT else impl
    reason = unsupported_reason(kernel, model.positional.kind, ctx.device.type, True)
    if reason or ctx.out_of_time():
        return ["", "", "", "", f"n/a: {reason}" if reason else "left out: budget"], trainer
    tokens = ctx.scale.throughput_micro_batch * ctx.scale.throughput_seq
    try:
        model.set_attention(kernel)
        model._flex.closed_form = impl != TABLE_VARIANT
        before = positional_values(trainer)
        seconds, mfu, memory = _cell(ctx, trainer, peak, tokens)
        frozen = unchanged(before, positional_values(trainer))
    except Exception as error:  # OOM or a kernel error: recorded, the next kernel gets a fresh trainer
        note = "OOM" if isinstance(error, torch.OutOfMemoryError) else f"error: {type(error).__name__}: {str(error)[:120]}"
        trainer.close()
        release(ctx.device)
        return ["", "", "", "", note], build(name, compile_)
    finally:
        model._flex.closed_form = True
    note = (model._flex.last_options or "") if kernel == "flex" else ""  # None when compiled into the layers
    if frozen:  # a kernel that trains without moving the positional parameters is not a valid measurement
        note = f"invalid: {', '.join(frozen)} unchanged after {ctx.scale.throughput_warmup + ctx.scale.throughput_steps} steps"
    else:
        results[(name, compile_, impl)] = (tokens / seconds, chosen, mfu)
    return [f"{seconds * 1e3:.1f}", f"{tokens / seconds:,.0f}", f"{mfu:.1%}", f"{memory / 2**30:.2f}", note], trainer


def positional_values(trainer: Any) -> dict[str, torch.Tensor]:
    """Copies of the positional embedding's trainable parameters, read from the optimizer's fp32 masters
    where it keeps them: a bf16 parameter rounds back to its old value when the steps add up to less
    than its resolution (2⁻⁸ relative), as they do once the cells' short lr schedule has decayed."""
    masters = {id(parameter): master for parameter, master in getattr(trainer.optimizer, "copies", [])}
    return {name: masters.get(id(p), p).detach().float().clone()
            for name, p in trainer.model.positional.named_parameters() if p.requires_grad}


def unchanged(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    """Names of the parameters that training left exactly as they were (compiled FlexAttention
    once gave KERPLE's parameters no gradient, so they never moved)."""
    return [f"positional.{name}" for name, value in before.items() if torch.equal(value, after[name])]


def _summary(ctx: StepContext, results: dict) -> dict[str, tuple[str, float, float]]:
    """Best setting per embedding and its ratio to ``none``'s best; the same for ``auto``. Returns the
    best ``(setting, tokens/s, MFU)`` per embedding."""
    table = ctx.result.table("Best per embedding (ratio: tokens/s / none's, each at its best)",
                             ["pos_emb", "best", "tokens/s", "MFU", "vs none", "auto", "auto tokens/s", "auto vs none"])
    best: dict[str, tuple[str, float, float]] = {}
    auto: dict[str, tuple[str, float]] = {}
    for (name, compile_, impl), (speed, chosen, mfu) in results.items():
        setting = f"{impl}, compile {'on' if compile_ else 'off'}"
        if speed > best.get(name, ("", 0.0, 0.0))[1]:
            best[name] = (setting, speed, mfu)
        if chosen and speed > auto.get(name, ("", 0.0))[1]:
            auto[name] = (setting, speed)
    for name in ctx.scale.step_embeddings(4):
        if name not in best:
            table.rows.append([name, "not measured", "", "", "", "", "", ""])
            continue
        setting, speed, mfu = best[name]
        ratio = f"{speed / best['none'][1]:.3f}" if "none" in best else ""
        chosen, auto_speed = auto.get(name, ("", 0.0))
        auto_ratio = f"{auto_speed / auto['none'][1]:.3f}" if auto_speed and "none" in auto else ""
        table.rows.append([name, setting, f"{speed:,.0f}", f"{mfu:.1%}", ratio, chosen,
                           f"{auto_speed:,.0f}" if auto_speed else "", auto_ratio])
    ctx.result.metrics = {"best_tokens_per_s": {name: value[1] for name, value in best.items()},
                          "best_mfu": {name: value[2] for name, value in best.items()}}
    return best


def target_checks(best: dict[str, tuple[str, float, float]], logit_terms: set[str], device: str) -> dict[str, bool]:
    """The targets of the module docstring, ``{description: met}``; those whose embeddings were not
    measured are left out (the table says so)."""
    checks: dict[str, bool] = {}
    if "kerple_log" in best:
        _, speed, mfu = best["kerple_log"]
        if "H100" in device:
            text = f"kerple_log >= {TARGET_TOKENS_PER_S:,} tokens/s on an H100 ({speed:,.0f})"
            checks[text] = speed >= TARGET_TOKENS_PER_S
        checks[f"kerple_log MFU >= {TARGET_MFU:.0%} ({mfu:.1%})"] = mfu >= TARGET_MFU
    if "none" not in best:
        return checks
    reference = best["none"][1]
    for name in sorted(logit_terms & set(best)):
        floor = KERPLE_LOG_RATIO if name == "kerple_log" else BIAS_RATIO
        ratio = best[name][1] / reference
        checks[f"{name} within {1 - floor:.0%} of none ({ratio:.3f})"] = ratio >= floor
    return checks


def run(ctx: StepContext) -> None:
    from kerple import positional
    from kerple.parallel.groups import init_distributed, teardown

    allow_recompiles()
    scale = ctx.scale
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    peak = measure_peak_flops(ctx.device, dtype, scale.peak_size)
    steps_per_setting = (scale.throughput_warmup + scale.throughput_steps) * (len(scale.throughput_impls) + 2)
    corpus = ctx.work / "throughput" / "corpus"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    overrides = {**scale.model_overrides, "seq_length": scale.throughput_seq,
                 "max_position_embeddings": scale.throughput_seq, "attention_impl": "auto",
                 "train_micro_batch_size_per_gpu": scale.throughput_micro_batch, "gradient_accumulation_steps": 1}
    vocab = int(model_config(scale, "none", **overrides).model.vocab_size)
    write_random_corpus(corpus, vocab, steps_per_setting * scale.throughput_micro_batch * (scale.throughput_seq + 1))
    parallel = init_distributed(1, 1)

    def build(name: str, compile_: bool) -> Any:
        return build_trainer([str(REPO / scale.model)], {**overrides, "compile": compile_}, name, str(corpus),
                             steps_per_setting, parallel)

    table = ctx.result.table("Every measured cell", COLUMNS)
    results: dict = {}
    try:
        for compile_ in scale.throughput_compile:
            for name in scale.step_embeddings(4):
                if compile_ and scale.compile_embeddings is not None and name not in scale.compile_embeddings:
                    continue
                table.rows += _setting(ctx, name, compile_, build, peak, results)
                ctx.progress(f"{name} compile={compile_} done")
    finally:
        teardown(parallel)
    best = _summary(ctx, results)
    logit_terms = {name for name in scale.step_embeddings(4) if positional.family(name).kind.value in ("bias", "weight")}
    checks = target_checks(best, logit_terms, torch.cuda.get_device_name(ctx.device)) if ctx.cuda else {}
    ctx.result.notes += [f"{'met' if ok else 'MISSED'}: {text}" for text, ok in checks.items()]
    ctx.result.notes += [
        f"peak for MFU: {peak / 1e12:.2f} TFLOP/s ({str(dtype).removeprefix('torch.')} "
        f"{scale.peak_size}x{scale.peak_size} matmul, measured in this step)",
        "FLOPs per token = 6·N + 12·L·h·s (PaLM App. B; N = matmul parameters; full s x s attention counted)",
        f"median of {scale.throughput_steps} Trainer.train_step calls after {scale.throughput_warmup} warm-up; "
        f"{scale.throughput_micro_batch} x {scale.throughput_seq} tokens per step",
    ]
    left_out = sum(1 for row in table.rows if row[-1].startswith(("left out", "OOM")))
    invalid = [f"{row[0]} {row[2]} (compile {row[1]})" for row in table.rows if row[-1].startswith("invalid")]
    missed = [text for text, ok in checks.items() if not ok]
    ctx.result.status = "passed" if results and not missed and not invalid else "failed"
    ctx.result.reason = "; ".join(
        [f"{len(results)} cells measured" + (f", {left_out} left out or OOM" if left_out else "")]
        + [f"invalid (positional parameters did not train): {', '.join(invalid)}"] * bool(invalid)
        + [f"missed: {text}" for text in missed])

