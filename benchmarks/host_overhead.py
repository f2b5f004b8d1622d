"""Host work per training step: operators (kernel launches on a GPU) and host synchronizations.

    python benchmarks/host_overhead.py                              # 162M, none and kerple_log, micro-batch 1 and 32
    python benchmarks/host_overhead.py --pe none --micro-batch 1 --top 15
    python benchmarks/host_overhead.py --model configs/models/tiny.yml --extra configs/setups/cpu.yml attention_impl=sdpa
    python benchmarks/host_overhead.py --micro-batch 1 --timed 30 hidden_size=48 seq_length=16 \
        max_position_embeddings=16 vocab_size=512 attention_impl=sdpa   # 162M's layers, the host's work alone

A real :class:`kerple.training.trainer.Trainer` per embedding and micro-batch size (the config's
precision and attention as written; ``gradient_accumulation_steps: 1``) on a synthetic corpus;
``--warmup`` untimed steps, ``--timed`` steps timed on the host, then ``--steps`` calls of
``Trainer.train_step`` under ``torch.profiler``. Per step it prints:

* **host ms**: the median time ``train_step`` holds the host, without synchronizing the device. On a
  GPU, the host's share of the step; on a CPU with the widths shrunk until the arithmetic is
  negligible (the example above), the Python and dispatch work a GPU step also costs its host.
* **ops**: top-level ATen operators, those called from Python or autograd rather than from inside
  another operator. On a GPU each is a kernel launch, except the metadata-only ones (views,
  ``detach``: the **views** column), which launch nothing.
* **syncs**: ``aten::_local_scalar_dense`` (``.item()``, ``bool(tensor)``, ``float(tensor)``): on a
  GPU each waits for the device's queue to drain. Not counted: the ones inside torch's CPU fused
  optimizer kernel (``_fused_adamw_`` reads its CPU step counters there; on a GPU the kernel reads
  them on the device), shown as **in-kernel reads**.
* **device waits**: synchronizations that DeepSpeed asks its accelerator for (its throughput timer did
  two per step); counted by wrapping the accelerator's ``synchronize``, so a CPU run sees them too,
  where they are no-ops the profiler cannot see.
* on CUDA, **launches** (``cudaLaunchKernel`` and kin, the device-side truth for ops) and
  **cuda syncs** (stream, event and device synchronizations).

The trainer reads the step's loss on the host only at log and save steps (one synchronization
there), so a ``train_step`` alone shows the per-step cost. Counts do not depend on the machine's
speed; on a CPU they predict what a GPU step launches, which is where they cost (5-10 µs of host
time per launch, while a 162M step's matmuls take about 17 ms on an H200).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kerple.errors import entry_point
from kerple.flags import AT_LEAST_0, AT_LEAST_1, check_flags, heavy_imports

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The flags, checked, and the ``key=value`` overrides (a bad flag is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="host_overhead.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "configs/models/162M.yml"), help="model YAML (default: 162M)")
    parser.add_argument("--extra", nargs="*", default=[], help="more YAML files")
    parser.add_argument("--pe", nargs="+", default=["none", "kerple_log"], help="embeddings (default: none kerple_log)")
    parser.add_argument("--micro-batch", nargs="+", type=int, default=[1, 32], help="micro-batch sizes (default: 1 32)")
    parser.add_argument("--steps", type=int, default=1, help="profiled steps per case (default 1)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--timed", type=int, default=5,
                        help="unprofiled steps whose median host time is the host-ms column (default 5; 0: none)")
    parser.add_argument("--threads", type=int, default=1,
                        help="PyTorch's intra-op threads on a CPU (default 1: a GPU step's host work is one thread)")
    parser.add_argument("--top", type=int, default=0, help="also list the N most frequent ops per case")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (anywhere on the line)")
    words = sys.argv[1:] if argv is None else list(argv)
    overrides = [word for word in words if "=" in word and not word.startswith("-")]
    args = parser.parse_args([word for word in words if word not in overrides])
    check_flags(args, {"--steps": AT_LEAST_1, "--warmup": AT_LEAST_0, "--top": AT_LEAST_0, "--timed": AT_LEAST_0,
                       "--threads": AT_LEAST_1})
    for size in args.micro_batch:
        check_flags(argparse.Namespace(micro_batch=size), {"--micro-batch": AT_LEAST_1})
    return args, overrides + args.overrides


with heavy_imports("host_overhead.py", parse_args if __name__ == "__main__" else None):
    import torch

    from kerple.measure.host_work import HostCounts, count_host_work, host_milliseconds, profiled_steps
    from kerple.measure.training import check_embeddings, measure_trainers


def measure(config_files: Sequence[str], overrides: dict[str, Any], names: Sequence[str], micro_batches: Sequence[int],
            *, steps: int, warmup: int, timed: int = 0) -> list[tuple[str, int, HostCounts | str]]:
    """``(pos_emb, micro-batch, counts or the error)`` for every pair, one trainer at a time."""

    def counted(trainer: Any) -> HostCounts:
        with contextlib.redirect_stdout(io.StringIO()):
            host_ms = host_milliseconds(trainer, timed) if timed else None
        profiler, waits = profiled_steps(trainer, steps, trainer.parallel.device)
        counts = count_host_work(profiler.events(), steps, cuda=trainer.parallel.device.type == "cuda")
        counts.device_waits, counts.host_ms = waits, host_ms
        return counts

    return measure_trainers(config_files, overrides, names, micro_batches, steps + timed, warmup, counted)


def print_table(results: list[tuple[str, int, HostCounts | str]], top: int) -> None:
    cuda = any(isinstance(c, HostCounts) and c.launches is not None for _, _, c in results)
    columns = ["pos_emb", "micro-batch", "host ms", "ops", "views", "syncs", "in-kernel reads", "device waits"]
    columns += ["launches", "cuda syncs"] if cuda else []
    print("| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1))
    for name, micro, counts in results:
        if isinstance(counts, str):
            print(f"| {name} | {micro} | failed: {counts} |" + " |" * (len(columns) - 3))
            continue
        host = "" if counts.host_ms is None else f"{counts.host_ms:.1f}"
        cells = [name, str(micro), host, f"{counts.ops:,.0f}", f"{counts.view_ops:,.0f}", f"{counts.syncs:g}",
                 f"{counts.kernel_reads:g}", f"{counts.device_waits:g}"]
        if cuda:
            cells += [f"{counts.launches:,.0f}", f"{counts.cuda_syncs:g}"]
        print("| " + " | ".join(cells) + " |")
    for name, micro, counts in results:
        if top and isinstance(counts, HostCounts):
            listed = ", ".join(f"{op.removeprefix('aten::')} {n / counts.steps:g}" for op, n in counts.top[:top])
            print(f"\n{name}, micro-batch {micro}, most frequent ops per step: {listed}")


@entry_point("host_overhead.py")
def main(argv: list[str] | None = None) -> int:
    from kerple.config import parse_overrides

    args, overrides = parse_args(argv)
    check_embeddings("--pe", args.pe)
    files = [args.model, *args.extra]
    torch.set_num_threads(args.threads)
    results = measure(files, parse_overrides(overrides), args.pe, args.micro_batch, steps=args.steps,
                      warmup=args.warmup, timed=args.timed)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"device: {device}; torch {torch.__version__}, {args.threads} thread(s); "
          f"{' + '.join(Path(f).name for f in files)}; "
          f"{args.steps} profiled Trainer.train_step call(s) after {args.warmup} warm-up and {args.timed} timed; "
          "counts per step")
    print_table(results, args.top)
    return 1 if any(isinstance(c, str) for _, _, c in results) else 0


if __name__ == "__main__":
    sys.exit(main())
