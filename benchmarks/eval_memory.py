"""Peak memory and tokens/s of evaluation (forward + chunked LM head and loss, no grad) per length
and attention implementation.

    python benchmarks/eval_memory.py                       # tiny CPU model: 2 layers, h=192, 12 heads
    python benchmarks/eval_memory.py --config configs/models/162M.yml --device cuda

Every (implementation, length) runs in a fresh subprocess so that one run's peak cannot hide in
another's. The subprocess builds the model, warms up (FlexAttention is compiled once per length, so
its warm-up calls the kernel at the measured length; eager and sdpa warm up at 256 tokens), then
measures one ``model.chunked_loss`` of batch 1:

* CPU: the growth of the resident set over the measured call: the high-water mark ``VmHWM`` is
  reset through ``/proc/self/clear_refs`` after the warm-up and read back afterwards (minus the
  resident set before the call); glibc is told to return freed blocks to the OS
  (``MALLOC_MMAP_THRESHOLD_``) so a warm-up's freed memory cannot be reused unseen. Where
  ``clear_refs`` is not writable, ``ru_maxrss`` of the whole subprocess is reported instead.
* CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation before the call (bf16 autocast).

One-time per-length work done in the warm-up is not in the figure: compilation and the cached
FlexAttention block mask (O((L/128)²), see ``kerple/model/flex.py``).

A run is skipped (and the table says why) when its estimated peak exceeds ``--budget-gib`` (default:
half the available RAM, or the free GPU memory), when a shorter length of the same implementation
already failed, or when its time extrapolated from the previous length exceeds ``--max-seconds``.
The memory estimate per implementation is :func:`kerple.measure.eval_memory.estimate_bytes`.

Finally peak memory is fitted against length over ``--fit-range`` (default 2048..16384) with
``peak = a + b·L + c·L²``: linear growth shows as c ≈ 0 and b = bytes per token; quadratic growth as
c ≈ (copies of the [H, L, L] fp32 scores) · 4 · H bytes per token².
"""

from __future__ import annotations

import argparse
import os
import sys

from kerple.errors import UsageError, entry_point
from kerple.flags import AT_LEAST_1, POSITIVE, check_flags, heavy_imports, name_list, number_list
from kerple.measure.eval_memory import EvalCell, EvalSettings, load_model_config, measure_all

IMPLS = ("eager", "sdpa", "flex", "triton")  # triton (CUDA only) is in the default on a GPU
LENGTHS = (512, 2048, 8192, 16384, 32768, 65536)
FIT_EXTRA_LENGTHS = (4096, 12288)  # more points inside the fit range on CPU


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="eval_memory.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], help="model YAML (repeatable); default: tiny model")
    parser.add_argument("--pos-emb", default="kerple_log")
    parser.add_argument("--impls", help="comma-separated, of eager, sdpa, flex, triton (default: eager,sdpa,flex "
                                        "and, on a GPU, triton)")
    parser.add_argument("--lengths", help=f"default {','.join(map(str, LENGTHS))} (on CPU plus {FIT_EXTRA_LENGTHS})")
    parser.add_argument("--fit-range", default="2048,16384", help="low,high lengths of the growth fit")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    parser.add_argument("--chunk-size", type=int, default=1024, help="positions per LM-head/loss chunk")
    parser.add_argument("--budget-gib", type=float, help="skip runs estimated above this (default: see above)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="skip runs projected to take longer")
    args = parser.parse_args(argv)
    check_flags(args, {"--chunk-size": AT_LEAST_1, "--budget-gib": POSITIVE, "--max-seconds": POSITIVE})
    if args.impls is not None:
        name_list("--impls", args.impls, IMPLS)
    if args.lengths is not None:
        number_list("--lengths", args.lengths, AT_LEAST_1)
    fit = number_list("--fit-range", args.fit_range, AT_LEAST_1)
    if len(fit) != 2 or fit[0] >= fit[1]:
        raise UsageError(f"--fit-range {args.fit_range}: expected two lengths low,high with low < high, e.g. 2048,16384")
    return args


with heavy_imports("eval_memory.py", parse_args if __name__ == "__main__" else None):
    import numpy as np
    import torch

    from kerple.runs import parse_lengths, resolve_device


def fit_growth(cells: list[EvalCell], low: int, high: int) -> str | None:
    """``peak = a + b·L + c·L²`` over measured lengths in [low, high] (least squares), as a sentence.

    With only two lengths, ``peak = a + c·L²`` is solved instead (and the doubling ratio shown).
    """
    points = [(c.length, c.peak_bytes) for c in cells if c.peak_bytes is not None and low <= c.length <= high]
    if len(points) < 2:
        return None
    lengths, peaks = np.array(points, dtype=float).T
    if len(points) == 2:
        c2, c0 = np.polyfit(lengths**2, peaks, 1)
        return (f"only two lengths: peak = {c2:.3g} B/token² · L² + {c0 / 2**20:.1f} MiB; "
                f"peak ratio {peaks[1] / peaks[0]:.2f} for {int(lengths[0])} → {int(lengths[1])}")
    c2, c1, c0 = np.polyfit(lengths, peaks, 2)
    b1, b0 = np.polyfit(lengths, peaks, 1)
    linear_residual = np.abs(peaks - (b1 * lengths + b0)).max()
    doubling = [
        f"{peaks[i + 1] / peaks[i]:.2f}" for i in range(len(points) - 1) if lengths[i + 1] == 2 * lengths[i]
    ]
    return (
        f"quadratic fit: {c2:.3g} B/token² + {c1:.4g} B/token + {c0 / 2**20:.1f} MiB; "
        f"linear fit: {b1:.4g} B/token + {b0 / 2**20:.1f} MiB (max residual {linear_residual / 2**20:.1f} MiB); "
        f"peak ratio per doubling: {', '.join(doubling) or 'n/a'} (linear → 2, quadratic → 4) "
        f"over {', '.join(str(int(x)) for x in lengths)}"
    )


def print_report(args: argparse.Namespace, cfg, results: list[EvalCell], budget: int, load: tuple) -> None:
    model = cfg.model
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {os.cpu_count()} cores"
    memory = "max_memory_allocated growth" if device.type == "cuda" else "resident-set growth (VmHWM)"
    print(f"device: {name}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
          f"load average before/after: {load[0]:.2f} / {os.getloadavg()[0]:.2f}")
    print(f"model: {', '.join(args.config) or 'tiny'}: {model.num_layers} layers, h={model.hidden_size}, "
          f"{model.num_attention_heads} heads, vocab {model.padded_vocab_size}, pos_emb {cfg.positional.pos_emb}; "
          f"batch 1, no grad, chunked loss ({args.chunk_size} positions per chunk), "
          f"{'bf16 autocast' if device.type == 'cuda' else 'fp32'}; budget {budget / 2**30:.1f} GiB")
    print(f"\n| impl | length | peak memory ({memory}) | estimate | tokens/s | mean loss | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for cell in results:
        peak = "—" if cell.peak_bytes is None else f"{cell.peak_bytes / 2**20:,.1f} MiB"
        speed = "—" if cell.seconds is None else f"{cell.tokens_per_second:,.0f}"
        loss = "—" if cell.loss is None else f"{cell.loss:.4f}"
        print(f"| {cell.impl} | {cell.length} | {peak} | {cell.estimate_bytes / 2**20:,.0f} MiB | {speed} | {loss} | "
              f"{cell.note} |")
    low, high = (int(x) for x in args.fit_range.split(","))
    print(f"\nGrowth of peak memory with length, fitted over {low}..{high} tokens:")
    for impl in args.impls.split(","):
        fit = fit_growth([c for c in results if c.impl == impl], low, high)
        print(f"- {impl}: {fit or 'fewer than 2 measured lengths in range'}")


@entry_point("eval_memory.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.device = str(resolve_device(args.device))
    if args.impls is None:
        args.impls = ",".join(IMPLS if args.device.startswith("cuda") else IMPLS[:3])
    load = os.getloadavg()
    cfg = load_model_config(args.config, args.pos_emb)
    if args.lengths:
        lengths = parse_lengths(args.lengths, "--lengths")
    else:
        extra = FIT_EXTRA_LENGTHS if torch.device(args.device).type == "cpu" else ()
        lengths = sorted({*LENGTHS, *extra})
    if args.budget_gib is not None:
        budget = int(args.budget_gib * 2**30)
    elif torch.device(args.device).type == "cuda":
        budget = int(torch.cuda.mem_get_info(torch.device(args.device))[0])
    else:
        import psutil

        budget = int(psutil.virtual_memory().available // 2)
    settings = EvalSettings(configs=args.config, pos_emb=args.pos_emb, impls=args.impls.split(","),
                            chunk_size=args.chunk_size, device=args.device, max_seconds=args.max_seconds)
    results = measure_all(settings, cfg, lengths, budget)
    print_report(args, cfg, results, budget, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
