"""Training throughput of every positional embedding on the current device, in one run.

    python benchmarks/train_throughput.py                    # tiny config on CPU, 162M on CUDA
    python benchmarks/train_throughput.py --pe none kerple_log alibi --steps 10
    python benchmarks/train_throughput.py --pe none kerple_log rpe --attention-impl sdpa --interleave --threads 1 \\
        seq_length=512 max_position_embeddings=512 train_micro_batch_size_per_gpu=4 vocab_size=4096
    python benchmarks/train_throughput.py --model configs/models/162M.yml --extra configs/setups/local_gpu.yml \\
        --attention-impl flex --no-compile micro_batch_size=16

What is timed: for each embedding a real :class:`kerple.training.trainer.Trainer` is built from the
config (``pos_emb`` swapped) on a synthetic corpus of uniform random tokens (speed does not depend
on the text), ``--warmup`` untimed steps are run, then each of ``--steps`` calls of
``Trainer.train_step`` is timed between device synchronizations; the median is reported. A timed
step therefore includes everything a training step does: reading the global batch from the
memory-mapped dataset, forward and loss, backward, the DeepSpeed engine's optimizer step (gradient
clipping, bf16/fp16 handling and loss scaling, the fused AdamW on CUDA, ZeRO if configured) and the
LR-scheduler step. It excludes logging, validation, checkpointing, engine construction and the
warm-up steps (where ``torch.compile`` and the allocator settle).

By default the embeddings run one after another. ``--interleave`` keeps every embedding's trainer
alive and runs one step of each per round (the order rotated every round), so ratios to ``none``
stay fair when the machine's load changes during the run (a shared CPU); memory figures then
include all trainers. ``--threads`` sets PyTorch's intra-op threads. ``--profile N`` then runs N
more steps per embedding under ``torch.profiler`` and prints the operators that take the time.

Defaults: CPU — ``configs/models/tiny.yml`` + ``configs/setups/cpu.yml``, the config's attention
implementation, no compile; CUDA — ``configs/models/162M.yml`` (32 x 512 tokens, bf16) +
``configs/setups/local_gpu.yml`` with ``attention_impl: auto`` and ``compile: true`` (the fastest
path the trainer offers); ``--attention-impl`` and ``--compile/--no-compile`` override either.

Reported per embedding: step time, tokens/s (global batch x seq_length per step), peak memory
(CUDA: ``torch.cuda.max_memory_allocated`` over the timed steps; CPU: the process's peak resident
set so far, which never decreases, so later rows are upper bounds), MFU, and tokens/s relative to
``none``.

MFU = tokens/s x FLOPs-per-token / peak FLOP/s, with

    FLOPs per token = 6*N + 12*L*h*s

(PaLM, Appendix B): N = parameters that do matmuls (all but the word and learned-position embedding
tables; the LM head counted whether tied or not), L layers, h hidden size, s sequence length; the
attention term counts the full s x s score and value products, as is customary, although causal
kernels skip about half. Positional-embedding work is not counted: it is exactly what this
benchmark charges to each embedding. The peak is measured, not quoted: the best of several large
square matmuls in the run's compute dtype (bf16/fp16 when the config trains in it on CUDA, fp32
otherwise) on the same device (``--peak-size``).

``tools/benchmark_speed.py`` prints the same measurement in the layout of KERPLE paper Table 4.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerple.errors import entry_point, exit_on_interrupt
from kerple.flags import AT_LEAST_0, AT_LEAST_1, check_flags, check_unique

with exit_on_interrupt("train_throughput.py"):  # Ctrl-C while torch loads: one line, status 130
    import torch

    from kerple.measure.device import measure_peak_flops, peak_bytes, release
    from kerple.measure.training import (
        build_trainer, check_embeddings, flops_per_token, timed_step, write_random_corpus,
    )

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    """Timing of one embedding; ``error`` is set when it could not run."""

    pos_emb: str
    impl: str = ""
    step_seconds: float = 0.0
    tokens_per_second: float = 0.0
    peak_bytes: int = 0
    mfu: float = 0.0
    error: str = ""


@dataclass
class Measurement:
    """Everything one run measured, plus what is needed to describe it."""

    device: str
    dtype: str
    peak_flops: float
    peak_size: int
    tokens_per_step: int
    seq_length: int
    layers: int
    hidden: int
    compile: bool
    steps: int
    warmup: int
    interleaved: bool = False
    results: list[Result] = field(default_factory=list)

    def ratio_to_none(self, result: Result) -> float | None:
        """tokens/s of ``result`` divided by that of ``none`` (None when ``none`` did not run)."""
        base = next((r.tokens_per_second for r in self.results if r.pos_emb == "none" and not r.error), None)
        return result.tokens_per_second / base if base and not result.error else None


def _compute_dtype(cfg: Any, device: torch.device) -> torch.dtype:
    precision = str(getattr(cfg.precision, "precision", "fp32"))
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        return torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.float32


def _error_text(error: Exception) -> str:
    first = (str(error).splitlines() or [""])[0][:120]
    return f"{type(error).__name__}: {first}"


def _record(result: Result, times: list[float], trainer: Any, run: Measurement, device: torch.device) -> None:
    """Fill ``result`` from the timed steps of ``trainer``."""
    model = trainer.model
    if hasattr(model, "resolve_attention_impl"):
        result.impl = model.resolve_attention_impl(device.type, True, run.seq_length)
    result.step_seconds = statistics.median(times)
    result.tokens_per_second = run.tokens_per_step / result.step_seconds
    result.peak_bytes = max(result.peak_bytes, peak_bytes(device))
    result.mfu = result.tokens_per_second * flops_per_token(model, run.layers, run.hidden, run.seq_length) / run.peak_flops


def _report(result: Result) -> None:
    status = result.error or f"{result.tokens_per_second:,.0f} tok/s"
    print(f"  measured {result.pos_emb}: {status}", file=sys.stderr, flush=True)


def _measure_alone(build: Any, name: str, run: Measurement, device: torch.device) -> Result:
    """One embedding at a time: build, warm up, time ``run.steps`` steps, release."""
    result, trainer = Result(name), None
    try:
        trainer = build(name)
        for _ in range(run.warmup):
            trainer.train_step()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = [timed_step(trainer, device) for _ in range(run.steps)]
        _record(result, times, trainer, run, device)
    except Exception as error:  # one failing embedding must not hide the others' numbers
        result.error = _error_text(error)
    finally:
        if trainer is not None:
            trainer.close()
        del trainer
        release(device)
    _report(result)
    return result


def _measure_interleaved(build: Any, names: Sequence[str], run: Measurement, device: torch.device) -> list[Result]:
    """Every embedding's trainer alive at once; each round runs one step of each, in an order
    rotated every round, so a change of machine load during the run reaches all embeddings alike.
    Memory figures then include every trainer's resident state."""
    results = {name: Result(name) for name in names}
    trainers: dict[str, Any] = {}
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in names:
        try:
            trainers[name] = build(name)
        except Exception as error:
            results[name].error = _error_text(error)
    for round_index in range(run.warmup + run.steps):
        shift = round_index % len(names)
        for name in [*names[shift:], *names[:shift]]:
            if name not in trainers:
                continue
            try:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                seconds = timed_step(trainers[name], device)
                results[name].peak_bytes = max(results[name].peak_bytes, peak_bytes(device))
            except Exception as error:
                results[name].error = _error_text(error)
                trainers.pop(name).close()
                continue
            if round_index >= run.warmup:
                times[name].append(seconds)
    for name, trainer in trainers.items():
        _record(results[name], times[name], trainer, run, device)
        trainer.close()
    trainers.clear()
    release(device)
    for result in results.values():
        _report(result)
    return [results[name] for name in names]


def profile_steps(build: Any, names: Sequence[str], steps: int, warmup: int, device: torch.device,
                  rows: int = 15) -> None:
    """Print the top operators (self time) of ``steps`` profiled train steps per embedding."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name in names:
        trainer = build(name)
        try:
            for _ in range(warmup):
                trainer.train_step()
            with profile(activities=activities) as profiler:
                for _ in range(steps):
                    trainer.train_step()
            print(f"\n{name}: top operators over {steps} profiled steps")
            print(profiler.key_averages().table(sort_by=sort_by, row_limit=rows, max_name_column_width=60))
        finally:
            trainer.close()
            release(device)


def measure(
    config_files: Sequence[str],
    overrides: dict[str, Any],
    names: Sequence[str],
    *,
    steps: int,
    warmup: int,
    peak_size: int | None = None,
    interleave: bool = False,
    profile: int = 0,
) -> Measurement:
    """Time ``Trainer.train_step`` of every embedding in ``names`` (one process, one device);
    ``interleave``: all trainers at once, one step of each per round (:func:`_measure_interleaved`);
    ``profile``: afterwards, that many steps per embedding under ``torch.profiler`` (:func:`profile_steps`)."""
    from kerple.config import load_config
    from kerple.parallel.groups import init_distributed, teardown

    parallel = init_distributed(1, 1)
    device = parallel.device
    try:
        base = load_config(list(config_files), dict(overrides)).resolve_batch(1)
        dtype = _compute_dtype(base, device)
        size = peak_size or (8192 if device.type == "cuda" else 1024)
        total = warmup + steps
        tokens_per_step = int(base.training.train_batch_size) * int(base.model.seq_length)
        run = Measurement(
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            dtype=str(dtype).removeprefix("torch."),
            peak_flops=measure_peak_flops(device, dtype, size),
            peak_size=size,
            tokens_per_step=tokens_per_step,
            seq_length=int(base.model.seq_length),
            layers=int(base.model.num_layers),
            hidden=int(base.model.hidden_size),
            compile=bool(getattr(base.training, "compile", False)),
            steps=steps,
            warmup=warmup,
            interleaved=interleave,
        )
        with tempfile.TemporaryDirectory() as tmp:
            need = total * int(base.training.train_batch_size) * (int(base.model.seq_length) + 1) * 2
            write_random_corpus(Path(tmp) / "corpus", int(base.model.vocab_size), need)

            def build(name: str) -> Any:
                return build_trainer(config_files, overrides, name, f"{tmp}/corpus", total, parallel)

            if interleave:
                run.results = _measure_interleaved(build, names, run, device)
            else:
                run.results = [_measure_alone(build, name, run, device) for name in names]
            if profile:
                profile_steps(build, names, profile, warmup, device)
    finally:
        teardown(parallel)
    return run


def describe(run: Measurement, config_files: Sequence[str]) -> str:
    """The header lines: device, setup, and the MFU formula with the measured peak."""
    return (
        f"device: {run.device}; torch {torch.__version__}; {' + '.join(Path(f).name for f in config_files)}; "
        f"{run.tokens_per_step} tokens/step at seq_length {run.seq_length}; compute dtype {run.dtype}; "
        f"compile={run.compile}; median of {run.steps} Trainer.train_step calls after {run.warmup} warm-up"
        f"{' (interleaved rounds)' if run.interleaved else ''}; {torch.get_num_threads()} threads\n"
        f"measured peak: {run.peak_flops / 1e12:.3f} TFLOP/s ({run.peak_size}x{run.peak_size} {run.dtype} matmul); "
        f"MFU with FLOPs/token = 6*N + 12*L*h*s"
    )


def print_table(run: Measurement, config_files: Sequence[str]) -> None:
    """Markdown table: one row per embedding."""
    memory = "peak memory (GiB)" if run.device != "CPU" else "peak RSS so far (GiB)"
    print(describe(run, config_files))
    print()
    print(f"| pos_emb | attention | step time (ms) | tokens/s | {memory} | MFU | tokens/s vs none |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in run.results:
        if r.error:
            print(f"| {r.pos_emb} | {r.impl or '-'} | - | - | - | - | failed: {r.error} |")
            continue
        ratio = run.ratio_to_none(r)
        print(f"| {r.pos_emb} | {r.impl} | {1000 * r.step_seconds:.1f} | {r.tokens_per_second:,.0f} | "
              f"{r.peak_bytes / 2**30:.2f} | {100 * r.mfu:.1f}% | {f'{ratio:.3f}' if ratio else '-'} |")


def default_setup(gpu: bool) -> tuple[str, list[str]]:
    """The model YAML and the setup YAMLs for this device."""
    if gpu:
        return str(REPO / "configs/models/162M.yml"), [str(REPO / "configs/setups/local_gpu.yml")]
    return str(REPO / "configs/models/tiny.yml"), [str(REPO / "configs/setups/cpu.yml")]


@entry_point("train_throughput.py")
def main(argv: list[str] | None = None) -> int:
    from kerple import positional
    from kerple.config import parse_overrides

    gpu = torch.cuda.is_available()
    model, extra = default_setup(gpu)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=model, help="model YAML (default: 162M on CUDA, tiny on CPU)")
    parser.add_argument("--extra", nargs="*", default=extra, help="more YAML files (default: the device's setup)")
    parser.add_argument("--pe", nargs="+", default=positional.names(), help="embeddings (default: all registered)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--attention-impl", help="default: auto on CUDA, the config's on CPU")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, help="default: on for CUDA, the config's on CPU")
    parser.add_argument("--peak-size", type=int, help="matmul size for the measured peak (default 8192 CUDA, 1024 CPU)")
    parser.add_argument("--interleave", action="store_true",
                        help="all embeddings' trainers at once, one step of each per round (ratios robust to load)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="then profile STEPS steps per embedding (torch.profiler, top operators by self time)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args(argv)
    check_flags(args, {"--steps": AT_LEAST_1, "--warmup": AT_LEAST_0, "--peak-size": AT_LEAST_1,
                       "--threads": AT_LEAST_1, "--profile": AT_LEAST_0})
    check_unique("--pe", args.pe)
    check_embeddings("--pe", args.pe)
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = parse_overrides(args.overrides)
    impl = args.attention_impl or ("auto" if gpu else None)
    if impl:
        overrides["attention_impl"] = impl
    compile_ = args.compile if args.compile is not None else (True if gpu else None)
    if compile_ is not None:
        overrides["compile"] = compile_
    names = ["none"] + [n for n in args.pe if n != "none"]
    files = [args.model, *args.extra]
    run = measure(files, overrides, names, steps=args.steps, warmup=args.warmup, peak_size=args.peak_size,
                  interleave=args.interleave, profile=args.profile)
    print()
    print_table(run, files)
    return 1 if any(r.error for r in run.results) else 0


if __name__ == "__main__":
    sys.exit(main())
