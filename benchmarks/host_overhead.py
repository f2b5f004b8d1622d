"""Host work per training step: operators (kernel launches on a GPU) and host synchronizations.

    python benchmarks/host_overhead.py                              # 162M, none and kerple_log, micro-batch 1 and 32
    python benchmarks/host_overhead.py --pe none --micro-batch 1 --top 15
    python benchmarks/host_overhead.py --model configs/models/tiny.yml --extra configs/setups/cpu.yml attention_impl=sdpa

A real :class:`kerple.training.trainer.Trainer` per embedding and micro-batch size (the config's
precision and attention as written; ``gradient_accumulation_steps: 1``) on a synthetic corpus;
``--warmup`` untimed steps, then ``--steps`` calls of ``Trainer.train_step`` under
``torch.profiler``. Per step it prints:

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
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kerple.errors import entry_point  # noqa: E402
from kerple.flags import AT_LEAST_0, AT_LEAST_1, check_flags, heavy_imports  # noqa: E402


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
    parser.add_argument("--top", type=int, default=0, help="also list the N most frequent ops per case")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (anywhere on the line)")
    words = sys.argv[1:] if argv is None else list(argv)
    overrides = [word for word in words if "=" in word and not word.startswith("-")]
    args = parser.parse_args([word for word in words if word not in overrides])
    check_flags(args, {"--steps": AT_LEAST_1, "--warmup": AT_LEAST_0, "--top": AT_LEAST_0})
    for size in args.micro_batch:
        check_flags(argparse.Namespace(micro_batch=size), {"--micro-batch": AT_LEAST_1})
    return args, overrides + args.overrides


with heavy_imports("host_overhead.py", parse_args if __name__ == "__main__" else None):
    import torch
    from torch.profiler import ProfilerActivity, profile

SYNC = "aten::_local_scalar_dense"
# ops that only make a new view of existing memory (or a detached alias): no kernel on a GPU
VIEW_OPS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::t", "aten::transpose",
    "aten::permute", "aten::expand", "aten::expand_as", "aten::squeeze", "aten::unsqueeze", "aten::select",
    "aten::slice", "aten::narrow", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind",
    "aten::as_strided", "aten::alias", "aten::detach", "aten::view_as", "aten::flatten", "aten::unflatten",
    "aten::lift_fresh", "aten::numpy_T", "aten::diagonal", "aten::unfold",
})
FUSED_OPTIMIZER_PREFIX = "aten::_fused_adam"
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
                "cudaGraphLaunch")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


@dataclass
class HostCounts:
    """Per-step averages of what the host did over ``steps`` profiled steps."""

    steps: int
    ops: float
    view_ops: float
    syncs: float
    kernel_reads: float
    launches: float | None = None
    cuda_syncs: float | None = None
    device_waits: float = 0.0  # DeepSpeed's accelerator synchronizations (profiled_steps sets it)
    top: list[tuple[str, int]] = field(default_factory=list)  # top-level ops over all steps, most frequent first


def _ancestors(event: Any) -> Iterable[Any]:
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def count_host_work(events: Iterable[Any], steps: int, cuda: bool = False) -> HostCounts:
    """Classify the profiler ``events`` of ``steps`` steps (module docstring)."""
    top: Counter[str] = Counter()
    syncs = kernel_reads = launches = cuda_syncs = 0
    for event in events:
        name = event.name
        if name.startswith(LAUNCH_CALLS):
            launches += 1
        elif name in SYNC_CALLS:
            cuda_syncs += 1
        if not name.startswith("aten::"):
            continue
        above = [parent.name for parent in _ancestors(event)]
        if name == SYNC:
            if any(parent.startswith(FUSED_OPTIMIZER_PREFIX) for parent in above):
                kernel_reads += 1
            else:
                syncs += 1
        if not any(parent.startswith("aten::") for parent in above):
            top[name] += 1
    total = sum(top.values())
    views = sum(count for name, count in top.items() if name in VIEW_OPS)
    return HostCounts(
        steps=steps, ops=total / steps, view_ops=views / steps, syncs=syncs / steps, kernel_reads=kernel_reads / steps,
        launches=launches / steps if cuda else None, cuda_syncs=cuda_syncs / steps if cuda else None,
        top=top.most_common(),
    )


@contextlib.contextmanager
def counted_device_waits() -> Iterator[list[int]]:
    """Count the calls of DeepSpeed's ``get_accelerator().synchronize()`` in the block (one entry each)."""
    from deepspeed.accelerator import get_accelerator

    accelerator, waits = get_accelerator(), []
    synchronize = accelerator.synchronize

    def counted(*args: Any, **kwargs: Any) -> Any:
        waits.append(1)
        return synchronize(*args, **kwargs)

    accelerator.synchronize = counted
    try:
        yield waits
    finally:
        del accelerator.synchronize  # the class's method again


def profiled_steps(trainer: Any, steps: int, device: torch.device, **options: Any) -> tuple[Any, float]:
    """Run ``steps`` ``train_step`` calls under ``torch.profiler`` (CPU, plus CUDA on a GPU; ``options``
    go to ``profile``); return the profiler and DeepSpeed's device waits per step. The device is
    synchronized before and after."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profile(activities=activities, **options) as profiler:
        with counted_device_waits() as waits:
            for _ in range(steps):
                trainer.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return profiler, len(waits) / steps


def measure(config_files: Sequence[str], overrides: dict[str, Any], names: Sequence[str], micro_batches: Sequence[int],
            *, steps: int, warmup: int) -> list[tuple[str, int, HostCounts | str]]:
    """``(pos_emb, micro-batch, counts or the error)`` for every pair, one trainer at a time."""
    from benchmarks.train_throughput import build_trainer, release, write_random_corpus
    from kerple.config import load_config
    from kerple.parallel.groups import init_distributed, teardown

    parallel = init_distributed(1, 1)
    results: list[tuple[str, int, HostCounts | str]] = []
    try:
        base = load_config(list(config_files), dict(overrides))
        total = steps + warmup
        with tempfile.TemporaryDirectory() as tmp:
            need = total * max(micro_batches) * (int(base.model.seq_length) + 1) * 2
            write_random_corpus(Path(tmp) / "corpus", int(base.model.vocab_size), need)
            for micro in micro_batches:
                for name in names:
                    settings = {**overrides, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1}
                    trainer = None
                    try:
                        trainer = build_trainer(config_files, settings, name, f"{tmp}/corpus", total, parallel)
                        with contextlib.redirect_stdout(io.StringIO()):
                            for _ in range(warmup):
                                trainer.train_step()
                        profiler, waits = profiled_steps(trainer, steps, parallel.device)
                        counts = count_host_work(profiler.events(), steps, cuda=parallel.device.type == "cuda")
                        counts.device_waits = waits
                        results.append((name, micro, counts))
                    except Exception as error:  # one failing case must not hide the others
                        results.append((name, micro, f"{type(error).__name__}: {str(error)[:150]}"))
                    finally:
                        if trainer is not None:
                            trainer.close()
                        del trainer
                        release(parallel.device)
                    print(f"  measured {name} at micro-batch {micro}", file=sys.stderr, flush=True)
    finally:
        teardown(parallel)
    return results


def print_table(results: list[tuple[str, int, HostCounts | str]], top: int) -> None:
    cuda = any(isinstance(c, HostCounts) and c.launches is not None for _, _, c in results)
    columns = ["pos_emb", "micro-batch", "ops", "views", "syncs", "in-kernel reads", "device waits"]
    columns += ["launches", "cuda syncs"] if cuda else []
    print("| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1))
    for name, micro, counts in results:
        if isinstance(counts, str):
            print(f"| {name} | {micro} | failed: {counts} |" + " |" * (len(columns) - 3))
            continue
        cells = [name, str(micro), f"{counts.ops:,.0f}", f"{counts.view_ops:,.0f}", f"{counts.syncs:g}",
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
    files = [args.model, *args.extra]
    results = measure(files, parse_overrides(overrides), args.pe, args.micro_batch, steps=args.steps,
                      warmup=args.warmup)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"device: {device}; torch {torch.__version__}; {' + '.join(Path(f).name for f in files)}; "
          f"{args.steps} profiled Trainer.train_step call(s) after {args.warmup} warm-up; counts per step")
    print_table(results, args.top)
    return 1 if any(isinstance(c, str) for _, _, c in results) else 0


if __name__ == "__main__":
    sys.exit(main())
