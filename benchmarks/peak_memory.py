"""What holds the peak memory of a training step, per embedding and micro-batch, in one run.

    python benchmarks/peak_memory.py                                   # 162M, none and kerple_log, micro-batch 32
    python benchmarks/peak_memory.py --pe none --micro-batch 2 4 --top 12
    python benchmarks/peak_memory.py --model configs/models/tiny.yml --extra configs/setups/cpu.yml --micro-batch 8

A real :class:`kerple.training.trainer.Trainer` per case (the config's precision and attention as
written, ``gradient_accumulation_steps: 1``) on a synthetic corpus; ``--warmup`` steps first (on a
GPU they compile), then one ``Trainer.train_step`` whose allocations are recorded
(:mod:`kerple.measure.peak_memory`). Per case it prints:

* **resident**: what the step starts with (parameters, their gradients, fp32 masters and optimizer
  state; on CUDA the allocator's count, which also holds anything else left allocated);
* **step's peak**: the most bytes the step's own allocations held at once (activations saved for
  the backward, the loss's chunks, gradients, temporaries), and **in all**, the two added; on CUDA
  also ``max_memory_allocated`` over the step, which ``tools/gpu_check.py --profile`` reports;
* below the table, for each case, the ``--top`` holders of the step's peak: the code that
  allocated what was alive then, with bytes and allocation counts.

The activations grow with the micro-batch and the loss's chunks do not (``kerple.model.lm_loss``),
so two micro-batch sizes on a CPU predict a GPU's peak at a size that would be slow to run here.
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
GIB = 2**30


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The flags, checked, and the ``key=value`` overrides (a bad flag is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="peak_memory.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "configs/models/162M.yml"), help="model YAML (default: 162M)")
    parser.add_argument("--extra", nargs="*", default=[], help="more YAML files")
    parser.add_argument("--pe", nargs="+", default=["none", "kerple_log"], help="embeddings (default: none kerple_log)")
    parser.add_argument("--micro-batch", nargs="+", type=int, default=[32], help="micro-batch sizes (default: 32)")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded steps first (default 1)")
    parser.add_argument("--top", type=int, default=8, help="holders of the peak listed per case (default 8)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (anywhere on the line)")
    words = sys.argv[1:] if argv is None else list(argv)
    overrides = [word for word in words if "=" in word and not word.startswith("-")]
    args = parser.parse_args([word for word in words if word not in overrides])
    check_flags(args, {"--warmup": AT_LEAST_0, "--top": AT_LEAST_0})
    for size in args.micro_batch:
        check_flags(argparse.Namespace(micro_batch=size), {"--micro-batch": AT_LEAST_1})
    return args, overrides + args.overrides


with heavy_imports("peak_memory.py", parse_args if __name__ == "__main__" else None):
    import torch

    from kerple.measure.peak_memory import Peak, cpu_events, cuda_events, live_at_peak, resident_bytes
    from kerple.measure.training import check_embeddings, measure_trainers


def recorded_step(trainer: Any) -> tuple[int, Peak, int | None]:
    """``(resident bytes, the step's peak, CUDA's max_memory_allocated or None)`` of one recorded step."""
    device = trainer.parallel.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        resident = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                trainer.train_step()
            torch.cuda.synchronize(device)
            snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        peak = live_at_peak(cuda_events(snapshot, device.index or 0))
        return resident, peak, torch.cuda.max_memory_allocated(device)
    resident = resident_bytes(trainer.model, trainer.optimizer)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                with_stack=True) as profiler, contextlib.redirect_stdout(io.StringIO()):
        trainer.train_step()
    return resident, live_at_peak(cpu_events(profiler)), None


def print_results(results: list[tuple[str, int, tuple[int, Peak, int | None] | str]], top: int) -> None:
    cuda = any(not isinstance(r, str) and r[2] is not None for _, _, r in results)
    columns = ["pos_emb", "micro-batch", "resident (GiB)", "step's peak (GiB)", "in all (GiB)"]
    columns += ["max allocated (GiB)"] if cuda else []
    print("| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1))
    for name, micro, result in results:
        if isinstance(result, str):
            print(f"| {name} | {micro} | failed: {result} |" + " |" * (len(columns) - 3))
            continue
        resident, peak, allocated = result
        cells = [name, str(micro), *(f"{size / GIB:.2f}" for size in (resident, peak.bytes, resident + peak.bytes))]
        cells += [f"{allocated / GIB:.2f}" if allocated is not None else ""] if cuda else []
        print("| " + " | ".join(cells) + " |")
    for name, micro, result in results:
        if top and not isinstance(result, str):
            print(f"\n{name}, micro-batch {micro}: what held the step's peak")
            for where, size, count in result[1].holders[:top]:
                print(f"  {size / GIB:7.3f} GiB in {count:4d} allocation(s)  {where}")


@entry_point("peak_memory.py")
def main(argv: list[str] | None = None) -> int:
    from kerple.config import parse_overrides

    args, overrides = parse_args(argv)
    check_embeddings("--pe", args.pe)
    files = [args.model, *args.extra]
    results = measure_trainers(files, parse_overrides(overrides), args.pe, args.micro_batch, 1, args.warmup,
                               recorded_step)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"device: {device}; torch {torch.__version__}; {' + '.join(Path(f).name for f in files)}; "
          f"one recorded Trainer.train_step after {args.warmup} warm-up step(s)")
    print_results(results, args.top)
    return 1 if any(isinstance(r, str) for _, _, r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
