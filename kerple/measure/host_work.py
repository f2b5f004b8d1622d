"""Host work per training step, read from ``torch.profiler`` events.

:func:`count_host_work` sorts a profile's events into

* **ops**: top-level ATen operators (called from Python or autograd, not from inside another
  operator); on a GPU each launches a kernel, except the metadata-only **views** (:data:`VIEW_OPS`);
* **syncs**: :data:`SYNC` (``.item()``, ``bool(tensor)``, ``float(tensor)``), where a GPU's queue
  must drain; the ones inside torch's CPU fused AdamW (it reads its step counters there, a GPU kernel
  reads them on the device) are kept apart as **in-kernel reads**;
* on CUDA, **launches** (:data:`LAUNCH_CALLS`) and **cuda syncs** (:data:`SYNC_CALLS`).

:func:`counted_device_waits` counts the synchronizations DeepSpeed asks its accelerator for, which
a CPU run makes too (as no-ops the profiler cannot see). :func:`profiled_steps` runs training steps
under both.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

SYNC = "aten::_local_scalar_dense"
# ops that only make a new view of existing memory (or a detached alias): no kernel on a GPU
VIEW_OPS = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::t", "aten::transpose",
    "aten::permute", "aten::expand", "aten::expand_as", "aten::squeeze", "aten::unsqueeze", "aten::select",
    "aten::slice", "aten::narrow", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind",
    "aten::as_strided", "aten::alias", "aten::detach", "aten::view_as", "aten::flatten", "aten::unflatten",
    "aten::lift_fresh", "aten::numpy_T", "aten::diagonal", "aten::unfold", "aten::unflatten_dense_tensors",
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
    device_waits: float = 0.0  # DeepSpeed's accelerator synchronizations (profiled_steps measures them)
    host_ms: float | None = None  # median host time of a step, unprofiled (host_milliseconds)
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


def host_milliseconds(trainer: Any, steps: int) -> float:
    """The median time ``train_step`` holds the host, over ``steps`` unprofiled calls. Nothing here
    synchronizes the device: on a GPU this is the host's time while the device runs behind it; on a
    CPU with a model too small for its arithmetic to count, the host's own work per step."""
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


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
