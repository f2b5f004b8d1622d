"""What a measurement needs from the device: synchronization, a median time, peak memory, a clean
slate between cases, and the measured matmul peak that every MFU figure divides by."""

from __future__ import annotations

import gc
import resource
import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_bytes(device: torch.device) -> int:
    """CUDA: peak allocated since the last reset; CPU: peak resident set of the process."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def release(device: torch.device) -> None:
    """Drop compiled graphs and cached memory between embeddings."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def median_seconds(call: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall seconds of ``repeats`` calls of ``call``, each between device synchronizations."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure_peak_flops(device: torch.device, dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Best FLOP/s of ``size`` x ``size`` matmuls in ``dtype`` on ``device`` (2*size^3 FLOPs each):
    the best of ``repeats`` timed batches of four products, after one untimed product."""
    left = torch.randn(size, size, device=device, dtype=dtype)
    right = torch.randn(size, size, device=device, dtype=dtype)
    left @ right  # warm-up
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        for _ in range(4):
            left @ right
        synchronize(device)
        best = min(best, (time.perf_counter() - started) / 4)
    return 2 * size**3 / best
