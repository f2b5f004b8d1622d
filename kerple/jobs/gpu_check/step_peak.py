"""Step 1: the device's measured matmul peak, the denominator of every MFU in this report.

bf16 on CUDA (the 162M runs train in bf16), fp32 on a CPU. The best of ten timed batches of four
``size x size`` products after a warm-up (:func:`kerple.measure.device.measure_peak_flops`);
2·size³ FLOPs each. Two sizes are measured so that a size too small to saturate the device shows.
"""

from __future__ import annotations

import torch

from kerple.jobs.gpu_check.context import StepContext
from kerple.measure.device import measure_peak_flops

NAME = "matmul peak (TFLOP/s)"


def run(ctx: StepContext) -> None:
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    table = ctx.result.table("Measured matmul throughput", ["size", "dtype", "TFLOP/s"])
    best = 0.0
    for size in (ctx.scale.peak_size // 2, ctx.scale.peak_size):
        flops = measure_peak_flops(ctx.device, dtype, size, repeats=10)
        best = max(best, flops)
        table.rows.append([f"{size}x{size}x{size}", str(dtype).removeprefix("torch."), f"{flops / 1e12:.3g}"])
        ctx.progress(f"{size}: {flops / 1e12:.3g} TFLOP/s")
    ctx.result.metrics = {"peak_flops": best, "dtype": str(dtype).removeprefix("torch.")}
    ctx.result.status = "passed"
    ctx.result.reason = f"peak {best / 1e12:.3g} TFLOP/s ({str(dtype).removeprefix('torch.')})"
