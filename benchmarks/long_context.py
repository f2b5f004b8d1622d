"""Training at long context: tokens/s and peak memory of learnable biases against ``none``, per length.

    python benchmarks/long_context.py                     # CUDA: 162M, bf16, none and kerple_log at 512, 8192, 16384
    python benchmarks/long_context.py --threads 2 vocab_size=4096     # CPU: the tiny model, 256, 1024, 4096 tokens
    python benchmarks/long_context.py --pe none kerple_log kerple_power rpe gauss_bias2 --lengths 512,8192
    python benchmarks/long_context.py --impls flex,sdpa --lengths 512,2048,8192   # both kernels per length
    python benchmarks/long_context.py --impls flex,triton --lengths 512,16384,65536  # the fused Triton kernel too

Each row (length x embedding x attention kernel) is one real ``Trainer`` run in a process of its own
(:mod:`benchmarks.train_throughput`: synthetic corpus, ``--warmup`` untimed steps, the median of
``--steps`` timed ``Trainer.train_step`` calls), so its peak memory is its own: CUDA
``torch.cuda.max_memory_allocated``, CPU the process's peak resident set (which includes the
interpreter and libraries: compare rows by their difference to ``none``).

Every length trains on the same ``--tokens`` per step (``micro batch = tokens / length``, default
16,384 on CUDA = the 162M config's 32 x 512), so attention whose memory is linear in the length shows
the same peak at every length, and a term that keeps an ``L x L`` tensor per sequence shows a peak
above ``none``'s that grows with ``L`` (column ``extra vs none``).

``--impls auto`` (the default) lets ``attention_impl: auto`` choose per length
(kerple/model/attention.py, ``FLEX_FROM_LENGTH``); ``--impls flex,sdpa`` measures both, which is the
measurement that table's CUDA rows are to be set from. Through flex a learnable distance-based term
trains detached, its distance tables' gradient summed apart (``kerple/model/bias_gradient.py``,
docs/flex-attention.md §5); ``triton`` trains it inside the fused Triton kernel (``attention_impl: triton``,
CUDA), whose backward's partial buffer stops growing as ``L²`` past 256 MB (docs/performance.md). Targets
(CUDA, 162M): kerple_log, kerple_power, rpe and gauss_bias2 at least 0.95 of ``none``'s tokens/s at 512;
kerple_log at 16,384 within 15% of ``none`` with no ``L²`` memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kerple.errors import UsageError, entry_point
from kerple.flags import AT_LEAST_0, AT_LEAST_1, check_flags, heavy_imports, name_list, number_list

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks.train_throughput, run as a script from any folder
IMPLS = ("auto", "flex", "sdpa", "eager", "triton")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads); device-dependent defaults stay ``None``
    (:func:`fill_defaults`)."""
    parser = argparse.ArgumentParser(prog="long_context.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", help="tokens per sequence, comma-separated (default: 512,8192,16384 on CUDA, "
                                          "256,1024,4096 on a CPU)")
    parser.add_argument("--pe", nargs="+", default=["none", "kerple_log"], help="embeddings (none is always added)")
    parser.add_argument("--impls", default="auto", help=f"attention kernels per row, comma-separated ({', '.join(IMPLS)})")
    parser.add_argument("--tokens", type=int, help="tokens per training step (default: 16384 on CUDA, 4096 on a CPU)")
    parser.add_argument("--steps", type=int, help="timed steps (default: 6 on CUDA, 3 on a CPU)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default: 3 on CUDA, 1 on a CPU)")
    parser.add_argument("--model", help="model YAML (default: 162M on CUDA, tiny on CPU)")
    parser.add_argument("--extra", nargs="*", help="more YAML files (default: the device's setup)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction,
                        help="training.compile (default: the config's)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads in each row's process (default: PyTorch's)")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # internal: one row, printed as JSON
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. vocab_size=4096)")
    args = parser.parse_args(argv)
    check_flags(args, {"--tokens": AT_LEAST_1, "--steps": AT_LEAST_1, "--warmup": AT_LEAST_0,
                       "--threads": AT_LEAST_1})
    if args.lengths is not None:
        number_list("--lengths", args.lengths, AT_LEAST_1)
    name_list("--impls", args.impls, IMPLS)
    return args


with heavy_imports("long_context.py", parse_args if __name__ == "__main__" else None):
    import torch


def run_row(config_files: list[str], extra: dict[str, Any], length: int, name: str, impl: str, tokens: int,
            steps: int, warmup: int, compile_: bool | None) -> dict[str, Any]:
    """One row in this process: the trainer at ``length`` tokens per sequence (config ``extra`` overrides);
    its numbers as a dict."""
    from benchmarks import train_throughput

    overrides: dict[str, Any] = {**extra, "seq_length": length, "max_position_embeddings": length,
                                 "train_micro_batch_size_per_gpu": tokens // length, "gradient_accumulation_steps": 1}
    overrides["attention_impl"] = impl
    if compile_ is not None:
        overrides["compile"] = compile_
    run = train_throughput.measure(config_files, overrides, [name], steps=steps, warmup=warmup)
    result = run.results[0]
    return {"length": length, "pos_emb": name, "requested": impl, "impl": result.impl, "error": result.error,
            "tokens_per_second": result.tokens_per_second, "peak_bytes": result.peak_bytes,
            "device": run.device, "dtype": run.dtype, "compile": run.compile}


def _child(args: argparse.Namespace, length: int, name: str, impl: str) -> dict[str, Any]:
    """:func:`run_row` in a fresh process (its own memory peak and compile caches)."""
    command = [sys.executable, __file__, "--row", f"{length},{name},{impl}", "--tokens", str(args.tokens),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", args.model,
               "--extra", *args.extra, "--"]
    if args.compile is not None:
        command.insert(-1, "--compile" if args.compile else "--no-compile")
    if args.threads:
        command[-1:-1] = ["--threads", str(args.threads)]
    command += args.overrides
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {"length": length, "pos_emb": name, "requested": impl, "impl": impl, "error": reason,
                "tokens_per_second": 0.0, "peak_bytes": 0}
    return json.loads(lines[-1])


def print_table(rows: list[dict[str, Any]]) -> None:
    """Markdown: tokens/s and peak memory per row, each against ``none`` at the same length."""
    base = {row["length"]: row for row in rows if row["pos_emb"] == "none" and not row["error"]}
    print("| tokens | pos_emb | attention | tokens/s | vs none | peak (GiB) | extra vs none (GiB) |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for row in rows:
        if row["error"]:
            print(f"| {row['length']:,} | {row['pos_emb']} | {row['requested']} | - | - | - | failed: {row['error']} |")
            continue
        none = base.get(row["length"])
        ratio = f"{row['tokens_per_second'] / none['tokens_per_second']:.3f}" if none else "-"
        extra = f"{(row['peak_bytes'] - none['peak_bytes']) / 2**30:+.3f}" if none else "-"
        print(f"| {row['length']:,} | {row['pos_emb']} | {row['impl']} | {row['tokens_per_second']:,.0f} | {ratio} | "
              f"{row['peak_bytes'] / 2**30:.3f} | {extra} |")


def fill_defaults(args: argparse.Namespace) -> None:
    """The device's defaults for the flags left out (CUDA: 162M, 16,384 tokens a step)."""
    from benchmarks.train_throughput import default_setup

    cuda = torch.cuda.is_available()
    model, extra = default_setup(cuda)
    defaults = {"lengths": "512,8192,16384" if cuda else "256,1024,4096", "tokens": 16384 if cuda else 4096,
                "steps": 6 if cuda else 3, "warmup": 3 if cuda else 1, "model": model, "extra": extra}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


@entry_point("long_context.py")
def main(argv: list[str] | None = None) -> int:
    from kerple.config import parse_overrides

    from kerple.measure.training import check_embeddings

    args = parse_args(argv)
    check_embeddings("--pe", args.pe)
    fill_defaults(args)
    files = [args.model, *args.extra]
    try:
        extra = parse_overrides(args.overrides)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.row:
        if args.threads:
            torch.set_num_threads(args.threads)
        length, name, impl = args.row.split(",")
        row = run_row(files, extra, int(length), name, impl, args.tokens, args.steps, args.warmup, args.compile)
        print(json.dumps(row))
        return 0
    lengths = number_list("--lengths", args.lengths, AT_LEAST_1)
    bad = [length for length in lengths if args.tokens % length]
    if bad:
        raise UsageError(f"--lengths {bad}: each must divide --tokens {args.tokens}")
    names = ["none"] + [name for name in args.pe if name != "none"]
    impls = name_list("--impls", args.impls, IMPLS)
    rows = []
    for length in lengths:
        for name in names:
            for impl in (["auto"] if name == "none" else impls):
                row = _child(args, length, name, impl)
                rows.append(row)
                status = row["error"] or f"{row['tokens_per_second']:,.0f} tok/s"
                print(f"  measured {length} {name} {impl}: {status}", file=sys.stderr, flush=True)
    device = next((row["device"] for row in rows if "device" in row), "?")
    print(f"\n{device}; torch {torch.__version__}; {' + '.join(Path(f).name for f in files)}; {args.tokens} tokens per "
          f"step; median of {args.steps} steps after {args.warmup} warm-up; one process per row\n")
    print_table(rows)
    return 1 if any(row["error"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
