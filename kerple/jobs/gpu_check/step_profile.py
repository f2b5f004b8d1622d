"""Step 8 (``--profile``): where a 162M training step's time goes, in under 150 s.

For ``none`` and ``kerple_log`` at the 162M shape (32 x 512 tokens, bf16, ``attention_impl: auto``),
first with the layers eager, then, on CUDA and while the budget lasts, compiled (``compile:
true``): a real ``Trainer`` (:func:`kerple.measure.training.build_trainer`), warm-up steps, then

* timed steps: the step time between device synchronizations, and the **host time**, the time
  ``Trainer.train_step`` takes to return without one (a step that waits for nothing returns as soon
  as its kernels are queued, so host time below step time means the GPU, not Python, sets the pace);
* the peak of allocated device memory over the timed steps (CPU: the process's peak resident set);
* ``torch.profiler`` over a few more steps: top-level operators, CUDA kernel launches and host
  synchronizations per step (:func:`kerple.measure.host_work.count_host_work`), the **GPU busy
  fraction** (the union of kernel intervals over the profiled wall time) and the 20 CUDA kernels
  with the most time.

The compiled rows decide whether ``compile: true`` should be the GPU default: the ratio of step
times is printed as a note. Nothing here fails on a number; the step fails only when a case could
not run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

from kerple.jobs.gpu_check.context import REPO, StepContext, allow_recompiles, model_config
from kerple.measure.device import peak_bytes, release, synchronize
from kerple.measure.host_work import count_host_work, profiled_steps
from kerple.measure.training import build_trainer, write_random_corpus

NAME = "profile: host work, GPU busy time and kernels per training step"
COLUMNS = ["pos_emb", "compile", "attention", "step (ms)", "host (ms)", "GPU busy", "ops", "launches", "syncs",
           "device waits", "cuda syncs", "peak memory (GiB)", "tokens/s"]
TOP_KERNELS = 20
COMPILE_COST = 3.0  # a compiled case takes about this many uncompiled ones (the compilation itself)


def interval_union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` intervals (overlaps counted once)."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        covered += end - max(start, reach)
        reach = end
    return covered


def device_kernels(events: Any) -> list[Any]:
    """The profiler's CUDA kernel events (none on a CPU)."""
    cuda = torch.autograd.DeviceType.CUDA
    return [event for event in events if getattr(event, "device_type", None) == cuda]


def kernel_summary(kernels: list[Any], steps: int, wall_us: float) -> tuple[float | None, list[list[str]]]:
    """(GPU busy fraction or None without kernels, rows of the ``TOP_KERNELS`` kernels by total time)."""
    if not kernels:
        return None, []
    intervals = [(k.time_range.start, k.time_range.end) for k in kernels]
    busy = interval_union(intervals) / wall_us if wall_us > 0 else None
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for kernel in kernels:
        totals[kernel.name][0] += 1
        totals[kernel.name][1] += kernel.time_range.elapsed_us()
    all_time = sum(total for _, total in totals.values())
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:TOP_KERNELS]
    rows = [[name[:90], f"{calls / steps:g}", f"{total / steps / 1e3:.3f}", f"{total / all_time:.1%}"]
            for name, (calls, total) in ranked]
    return busy, rows


def _case(ctx: StepContext, trainer: Any, steps: dict[str, int]) -> tuple[dict[str, Any], list[list[str]]]:
    """Measure one built trainer: timed steps, then profiled steps."""
    device = ctx.device
    for _ in range(steps["warmup"]):
        trainer.train_step()
    synchronize(device)
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(device)
    host = 0.0
    started = time.perf_counter()
    for _ in range(steps["timed"]):
        step_start = time.perf_counter()
        trainer.train_step()
        host += time.perf_counter() - step_start
    synchronize(device)
    step_seconds = (time.perf_counter() - started) / steps["timed"]
    memory = peak_bytes(device)
    wall_start = time.perf_counter()
    profiler, waits = profiled_steps(trainer, steps["profiled"], device)
    wall_us = (time.perf_counter() - wall_start) * 1e6
    events = profiler.events()
    counts = count_host_work(events, steps["profiled"], cuda=ctx.cuda)
    busy, kernels = kernel_summary(device_kernels(events), steps["profiled"], wall_us)
    tokens = ctx.scale.throughput_micro_batch * ctx.scale.throughput_seq
    metrics = {"step_ms": step_seconds * 1e3, "host_ms": host / steps["timed"] * 1e3, "gpu_busy": busy,
               "ops": counts.ops, "view_ops": counts.view_ops, "launches": counts.launches, "syncs": counts.syncs,
               "device_waits": waits,
               "cuda_syncs": counts.cuda_syncs, "peak_memory_bytes": memory, "tokens_per_s": tokens / step_seconds,
               "top_ops": counts.top[:20], "top_kernels": kernels}
    return metrics, kernels


def _row(name: str, compile_: bool, impl: str, m: dict[str, Any]) -> list[str]:
    def optional(value: float | None, text: str) -> str:
        return "n/a" if value is None else text.format(value)

    return [name, "on" if compile_ else "off", impl, f"{m['step_ms']:.1f}", f"{m['host_ms']:.1f}",
            optional(m["gpu_busy"], "{:.1%}"), f"{m['ops']:,.0f}", optional(m["launches"], "{:,.0f}"),
            f"{m['syncs']:g}", f"{m['device_waits']:g}", optional(m["cuda_syncs"], "{:g}"), f"{m['peak_memory_bytes'] / 2**30:.2f}",
            f"{m['tokens_per_s']:,.0f}"]


def run(ctx: StepContext) -> None:
    from kerple.parallel.groups import init_distributed, teardown

    allow_recompiles()
    scale = ctx.scale
    steps = {"warmup": scale.throughput_warmup, "timed": scale.throughput_steps, "profiled": scale.profile_steps}
    total = sum(steps.values())
    overrides = {**scale.model_overrides, "seq_length": scale.throughput_seq,
                 "max_position_embeddings": scale.throughput_seq, "attention_impl": "auto",
                 "train_micro_batch_size_per_gpu": scale.throughput_micro_batch, "gradient_accumulation_steps": 1}
    corpus = ctx.work / "profile" / "corpus"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    vocab = int(model_config(scale, "none", **overrides).model.vocab_size)
    write_random_corpus(corpus, vocab, total * scale.throughput_micro_batch * (scale.throughput_seq + 1))
    table = ctx.result.table("Per training step", COLUMNS)
    cases = [(name, compile_) for compile_ in (False, True) for name in scale.profile_embeddings]
    parallel = init_distributed(1, 1)
    last, left_out, failed = 0.0, [], []
    try:
        for name, compile_ in cases:
            label = f"{name}, compile {'on' if compile_ else 'off'}"
            if compile_ and not ctx.cuda:
                left_out.append(f"{label} (compile is measured on CUDA only)")
                continue
            if ctx.remaining() < last * (COMPILE_COST if compile_ else 1.2):
                left_out.append(f"{label} (budget)")
                continue
            started, trainer = time.monotonic(), None
            try:
                trainer = build_trainer([str(REPO / scale.model)], {**overrides, "compile": compile_}, name,
                                        str(corpus), total, parallel)
                metrics, kernels = _case(ctx, trainer, steps)
                impl = trainer.model.resolve_attention_impl(ctx.device.type, True, scale.throughput_seq)
            except Exception as error:  # recorded; the next case still runs
                failed.append(f"{label}: {type(error).__name__}: {str(error)[:200]}")
                ctx.progress(failed[-1])
                continue
            finally:
                if trainer is not None:
                    trainer.close()
                release(ctx.device)
            last = time.monotonic() - started
            table.rows.append(_row(name, compile_, impl, metrics))
            ctx.result.metrics[label] = metrics
            kernel_table = ctx.result.table(f"Top {TOP_KERNELS} CUDA kernels: {label}",
                                            ["kernel", "calls/step", "ms/step", "share of GPU time"])
            kernel_table.rows += kernels or [["(no CUDA kernels: CPU run)", "", "", ""]]
            ctx.progress(" | ".join(table.rows[-1]))
    finally:
        teardown(parallel)
    _notes(ctx, steps, left_out)
    ctx.result.status = "passed" if table.rows and not failed else "failed"
    ctx.result.reason = "; ".join([f"{len(table.rows)} cases profiled"] + [f"failed: {f}" for f in failed]
                                  + ([f"left out: {', '.join(left_out)}"] if left_out else []))


def _notes(ctx: StepContext, steps: dict[str, int], left_out: list[str]) -> None:
    scale, metrics = ctx.scale, ctx.result.metrics
    ctx.result.notes += [
        f"{scale.throughput_micro_batch} x {scale.throughput_seq} tokens per step; {steps['warmup']} warm-up, "
        f"{steps['timed']} timed and {steps['profiled']} profiled Trainer.train_step calls per case",
        "ops: top-level ATen operators per step (views launch no kernel); syncs: aten::_local_scalar_dense outside "
        "the fused optimizer kernel; device waits: DeepSpeed's accelerator synchronizations (also among the cuda "
        "syncs); cuda syncs: stream, event and device synchronizations",
    ]
    for name in scale.profile_embeddings:
        off, on = metrics.get(f"{name}, compile off"), metrics.get(f"{name}, compile on")
        if off and on:
            ratio = off["step_ms"] / on["step_ms"]
            verdict = "faster" if ratio > 1 else "slower"
            ctx.result.notes.append(f"{name}: compiled layers {ratio:.2f}x the speed of eager ({verdict})")
