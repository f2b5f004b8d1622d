"""Step 7: evaluation of the 162M model at 2k-64k tokens per attention implementation: peak memory
and tokens/s, with what cannot fit skipped and said so.

:mod:`kerple.measure.eval_memory` does the measuring, as for ``benchmarks/eval_memory.py``: every
(implementation, length) in a fresh subprocess (one forward + chunked loss of batch 1 under bf16
autocast, ``max_memory_allocated`` growth), skipping a cell whose estimated peak exceeds the free
GPU memory, whose projected time exceeds ``eval_max_seconds``, or whose shorter length already
failed; an out-of-memory error is caught and reported as such. FlexAttention runs first: it is the long-context path, and the
targets below are about it. Targets: at 16384 tokens under ``TARGET_16K_GIB`` GiB, and 65536 tokens
without running out of memory.
"""

from __future__ import annotations

import torch

from kerple.jobs.gpu_check.context import REPO, StepContext
from kerple.measure.eval_memory import EvalCell, EvalSettings, load_model_config, measure_all

NAME = "long-context evaluation: memory and speed"
TARGET_16K_GIB = 20.0
POS_EMB = "kerple_log"


def run(ctx: StepContext) -> None:
    scale = ctx.scale
    configs = [str(REPO / scale.eval_model)] if scale.eval_model else []
    cfg = load_model_config(configs, POS_EMB)
    if ctx.cuda:
        budget = int(torch.cuda.mem_get_info(ctx.device)[0])
    else:
        import psutil

        budget = int(psutil.virtual_memory().available // 2)
    table = ctx.result.table(
        f"{POS_EMB}, batch 1, forward + chunked loss (CUDA: bf16 autocast, max_memory_allocated growth)",
        ["impl", "length", "peak memory (MiB)", "tokens/s", "mean loss", "note"],
    )
    cells = []
    for impl in scale.eval_impls:
        if ctx.out_of_time():
            table.rows += [[impl, str(length), "", "", "", "left out: step budget used up"] for length in scale.eval_lengths]
            continue
        settings = EvalSettings(configs=configs, pos_emb=POS_EMB, impls=[impl], chunk_size=1024,
                                device=ctx.device.type, max_seconds=scale.eval_max_seconds)
        for cell in measure_all(settings, cfg, list(scale.eval_lengths), budget):
            cells.append(cell)
            peak = "" if cell.peak_bytes is None else f"{cell.peak_bytes / 2**20:,.1f}"
            speed = "" if cell.seconds is None else f"{cell.tokens_per_second:,.0f}"
            loss = "" if cell.loss is None else f"{cell.loss:.4f}"
            table.rows.append([cell.impl, str(cell.length), peak, speed, loss, cell.note])
        ctx.progress(f"{impl} done")
    errors = [c for c in cells if c.peak_bytes is None and not c.note.startswith("skipped")]
    ctx.result.notes.append(f"memory budget for the skip rule: {budget / 2**30:.1f} GiB")
    ctx.result.status, ctx.result.reason = _verdict(ctx, cells, errors)


def _verdict(ctx: StepContext, cells: list[EvalCell], errors: list[EvalCell]) -> tuple[str, str]:
    """Passed when nothing failed unexpectedly and, on CUDA, flex meets both targets."""
    if not ctx.cuda:
        return ("failed", f"{len(errors)} cells failed") if errors else ("passed", f"{len(cells)} cells")
    flex = {c.length: c for c in cells if c.impl == "flex"}
    checks = []
    if 16384 in flex:
        peak = flex[16384].peak_bytes
        checks.append((f"flex at 16384 under {TARGET_16K_GIB:g} GiB "
                       f"({'not run' if peak is None else f'{peak / 2**30:.2f} GiB'})",
                       peak is not None and peak < TARGET_16K_GIB * 2**30))
    if 65536 in flex:
        checks.append(("flex at 65536 without running out of memory", flex[65536].peak_bytes is not None))
    ctx.result.notes += [f"{'met' if ok else 'MISSED'}: {text}" for text, ok in checks]
    missed = [text for text, ok in checks if not ok]
    if missed:
        return "failed", "; ".join(missed)
    others = [c for c in errors if c.impl != "flex"]
    return "passed", "targets met" + (f"; {len(others)} eager/sdpa cells out of memory or failed" if others else "")
