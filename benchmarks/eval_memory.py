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
The memory estimate per implementation is :func:`estimate_bytes`.

Finally peak memory is fitted against length over ``--fit-range`` (default 2048..16384) with
``peak = a + b·L + c·L²``: linear growth shows as c ≈ 0 and b = bytes per token; quadratic growth as
c ≈ (copies of the [H, L, L] fp32 scores) · 4 · H bytes per token².
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kerple.errors import UsageError, entry_point
from kerple.flags import AT_LEAST_1, POSITIVE, check_flags, heavy_imports, name_list, number_list

IMPLS = ("eager", "sdpa", "flex")
LENGTHS = (512, 2048, 8192, 16384, 32768, 65536)
FIT_EXTRA_LENGTHS = (4096, 12288)  # more points inside the fit range on CPU


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="eval_memory.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], help="model YAML (repeatable); default: tiny model")
    parser.add_argument("--pos-emb", default="kerple_log")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--lengths", help=f"default {','.join(map(str, LENGTHS))} (on CPU plus {FIT_EXTRA_LENGTHS})")
    parser.add_argument("--fit-range", default="2048,16384", help="low,high lengths of the growth fit")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    parser.add_argument("--chunk-size", type=int, default=1024, help="positions per LM-head/loss chunk")
    parser.add_argument("--budget-gib", type=float, help="skip runs estimated above this (default: see above)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="skip runs projected to take longer")
    parser.add_argument("--worker-impl", help=argparse.SUPPRESS)
    parser.add_argument("--worker-length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_flags(args, {"--chunk-size": AT_LEAST_1, "--budget-gib": POSITIVE, "--max-seconds": POSITIVE})
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
TINY_MODEL = {
    "num_layers": 2,
    "hidden_size": 192,
    "num_attention_heads": 12,
    "seq_length": 512,
    "vocab_size": 512,
    "make_vocab_size_divisible_by": 128,
}
SCORE_COPIES = {"eager": 5, "sdpa": 2, "flex": 0}  # fp32 [H, L, L] tensors alive at the peak


@dataclass
class Measurement:
    """One (implementation, length) cell: ``peak_bytes``/``seconds``/``loss`` are None when not run."""

    impl: str
    length: int
    estimate_bytes: int
    peak_bytes: int | None = None
    seconds: float | None = None
    loss: float | None = None
    note: str = ""

    @property
    def tokens_per_second(self) -> float | None:
        return None if self.seconds is None else self.length / self.seconds


def load_model_config(config_files: list[str], pos_emb: str):
    """The benchmark's :class:`kerple.config.Config`: ``config_files`` or the tiny CPU model."""
    from kerple.config import load_config

    overrides = {"pos_emb": pos_emb, "train_iters": 0, "attention_impl": "eager"}
    if not config_files:
        overrides.update(TINY_MODEL)
    return load_config(config_files, overrides)


def estimate_bytes(impl: str, length: int, cfg, chunk_size: int) -> int:
    """Estimated peak growth of one no-grad evaluation of batch 1 at ``length`` tokens.

    Activations: ~8 hidden-sized plus two 4h-sized fp32 tensors per token (one layer at a time);
    the loss: three fp32 ``[chunk, V]`` tensors; distance tables ``[H, L]``; and for eager/sdpa
    ``SCORE_COPIES[impl]`` fp32 ``[H, L, L]`` tensors plus the int64 distance and bool mask ``[L, L]``.
    """
    model = cfg.model
    hidden, heads, vocab = model.hidden_size, model.num_attention_heads, model.padded_vocab_size
    activations = 4 * length * (8 * hidden + 2 * 4 * hidden)
    logits = 3 * 4 * min(chunk_size, length) * vocab
    tables = 2 * 4 * heads * length
    quadratic = 0 if impl == "flex" else SCORE_COPIES[impl] * 4 * heads * length**2 + 9 * length**2
    return activations + logits + tables + quadratic


# --- the measuring subprocess ----------------------------------------------------------------


def _status_bytes(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process from /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current resident set (Linux >= 4.0); False where not permitted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _warm_up(model, impl: str, length: int, device: torch.device, vocab: int) -> None:
    """Load kernels; for flex, compile the attention kernel for exactly ``length`` keys."""
    if impl == "flex":
        heads, head_dim = model.num_heads, model.hidden_size // model.num_heads
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # q, k, v dtype under autocast
        # the same view of a fused [b, s, 3h] projection as SelfAttention, so the strides (which the
        # compiled kernel is specialized on) match the measured call
        fused = torch.randn(1, length, heads, 3 * head_dim, device=device, dtype=dtype).transpose(1, 2)
        query, key, value = fused.split(head_dim, dim=-1)  # each [1, H, L, d]
        with torch.no_grad():
            context = model.attention_context(length, device)  # the term the layers will hand flex
            hidden = torch.zeros(1, length, model.hidden_size, device=device, dtype=dtype)
            context = context.for_layer(0, hidden)  # a term of each layer's input (CABLE) is bound here
            model._flex(query, key, value, context.flex_term(dtype), context.window)
        del fused, query, key, value
    tokens = torch.randint(0, vocab, (1, min(length, 256) + 1), device=device)
    with torch.no_grad(), _autocast(device):
        model.chunked_loss(tokens[:, :-1], tokens[:, 1:])


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def worker(args: argparse.Namespace) -> dict:
    """Measure one (impl, length) in this process; returns the JSON-able result."""
    from kerple.model import build_model

    device = torch.device(args.device)
    cfg = load_model_config(args.config, args.pos_emb)
    torch.manual_seed(0)
    model = build_model(cfg).to(device).eval()
    model.set_attention(args.worker_impl)
    vocab = cfg.model.vocab_size
    _warm_up(model, args.worker_impl, args.worker_length, device, vocab)
    tokens = torch.randint(0, vocab, (1, args.worker_length + 1), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(device)
    gc.collect()
    method = "VmHWM"
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = _status_bytes("VmRSS")
        if not _reset_peak_rss():
            method, base = "ru_maxrss (whole process)", 0
    compiled_frames = torch._dynamo.utils.counters["frames"]["ok"]
    started = time.perf_counter()
    try:
        with torch.no_grad(), _autocast(device):
            loss = model.chunked_loss(tokens[:, :-1], tokens[:, 1:], chunk_size=args.chunk_size).mean().item()
    except torch.OutOfMemoryError:
        return {"error": "out of memory"}
    seconds = time.perf_counter() - started
    if torch._dynamo.utils.counters["frames"]["ok"] != compiled_frames:
        method += "; recompiled during the measured call (time includes compilation)"
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    elif method == "VmHWM":
        peak = _status_bytes("VmHWM") - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_bytes": peak, "seconds": seconds, "loss": loss, "method": method}


# --- the driver --------------------------------------------------------------------------------


def run_one(args: argparse.Namespace, impl: str, length: int, timeout: float) -> dict:
    """Run :func:`worker` for ``(impl, length)`` in a fresh interpreter; its JSON result or an error."""
    command = [sys.executable, __file__, "--worker-impl", impl, "--worker-length", str(length),
               "--device", args.device, "--pos-emb", args.pos_emb, "--chunk-size", str(args.chunk_size)]
    command += [arg for path in args.config for arg in ("--config", path)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        killed = " (killed: out of memory?)" if done.returncode < 0 else ""
        return {"error": f"exit {done.returncode}{killed}: {last[:120]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_all(args: argparse.Namespace, cfg, lengths: list[int], budget: int) -> list[Measurement]:
    """Every (impl, length) in increasing length, skipping what cannot fit or finish."""
    results = []
    for impl in args.impls.split(","):
        blocked, previous = "", None
        for length in lengths:
            cell = Measurement(impl, length, estimate_bytes(impl, length, cfg, args.chunk_size))
            results.append(cell)
            if blocked:
                cell.note = blocked
            elif cell.estimate_bytes > budget:
                cell.note = f"skipped: estimated {cell.estimate_bytes / 2**30:.1f} GiB > budget {budget / 2**30:.1f} GiB"
            elif previous is not None and _projected_seconds(previous, length, impl) > args.max_seconds:
                cell.note = (f"skipped: projected {_projected_seconds(previous, length, impl):.0f} s "
                             f"> --max-seconds {args.max_seconds:.0f}")
            if cell.note:
                blocked = blocked or "skipped: a shorter length was skipped or failed"
                continue
            outcome = run_one(args, impl, length, timeout=args.max_seconds * 3 + 120)
            if "error" in outcome:
                cell.note, blocked = outcome["error"], "skipped: a shorter length failed"
            else:
                cell.peak_bytes, cell.seconds, cell.loss = outcome["peak_bytes"], outcome["seconds"], outcome["loss"]
                cell.note = outcome["method"].removeprefix("VmHWM").removeprefix("; ")
                previous = cell
            print(f"  {impl:5s} {length:6d}: {_cell_text(cell)}", file=sys.stderr, flush=True)
    return results


def _projected_seconds(previous: Measurement, length: int, impl: str) -> float:
    """The attention work grows as L² for every kernel (flex skips only the masked half)."""
    return previous.seconds * (length / previous.length) ** 2


def _cell_text(cell: Measurement) -> str:
    if cell.peak_bytes is None:
        return cell.note
    return f"{cell.peak_bytes / 2**20:.1f} MiB, {cell.tokens_per_second:.0f} tok/s, loss {cell.loss:.4f}"


def fit_growth(cells: list[Measurement], low: int, high: int) -> str | None:
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


def print_report(args: argparse.Namespace, cfg, results: list[Measurement], budget: int, load: tuple) -> None:
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
    if args.worker_impl:
        print(json.dumps(worker(args)))
        return 0
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
    results = measure_all(args, cfg, lengths, budget)
    print_report(args, cfg, results, budget, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
