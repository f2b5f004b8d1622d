"""Training throughput per positional embedding, with model FLOPs utilization (issue 7).

    python benchmarks/gpu_train_throughput.py                 # 162M, 32 x 512 tokens, on CUDA
    python benchmarks/gpu_train_throughput.py --tiny          # CPU smoke check (tiny model)

For every embedding in ``--pos-emb`` (default: none, kerple_log, kerple_power, kerple_log3, alibi,
rpe, rotary, sinusoidal, sandwich), in one process on the same device: build the config's model
(``configs/models/162M.yml``; ``attention_impl: auto`` unless ``--attention-impl``), compile its
layers (``kerple.model.maybe_compile``; default on CUDA, ``--compile``/``--no-compile``), and time ``--steps``
optimizer steps after ``--warmup`` untimed ones on random tokens: forward under bf16 autocast (CUDA),
cross entropy, backward, gradient clipping at 1.0, ``torch.optim.AdamW(fused=True)`` on CUDA. The data
pipeline and DeepSpeed are not included.

Reported per embedding: step time, tokens/s, peak memory (CUDA: ``max_memory_allocated``; CPU: peak
resident set of the process so far), MFU and the ratio of tokens/s to ``none``.

MFU = tokens/s · FLOPs-per-token / peak FLOP/s, with

    FLOPs per token = 6·N + 12·L·h·s

(PaLM, Appendix B): N = parameters that do matmuls (everything but the word and learned position
embedding tables; the untied LM head included), L layers, h hidden size, s sequence length; the
attention term counts the full s×s score and value products (forward 2·2·h·s per layer, ×3 with the
backward), as is customary, although causal kernels skip half of them. Positional-embedding work is
not counted: it is exactly what this benchmark charges to each embedding. The peak is measured, not
quoted: the best of several large square matmuls in the training dtype (bf16 on CUDA, fp32 on CPU)
on the same device (``--peak-size``).
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

EMBEDDINGS = "none,kerple_log,kerple_power,kerple_log3,alibi,rpe,rotary,sinusoidal,sandwich"
TINY_OVERRIDES = {
    "num_layers": 2,
    "hidden_size": 96,
    "num_attention_heads": 4,
    "seq_length": 64,
    "max_position_embeddings": 64,
    "vocab_size": 256,
    "make_vocab_size_divisible_by": 128,
    "micro_batch_size": 2,
}


@dataclass
class Result:
    """Timing of one embedding; ``error`` set when it could not run."""

    pos_emb: str
    impl: str = ""
    step_seconds: float = 0.0
    tokens_per_second: float = 0.0
    peak_bytes: int = 0
    mfu: float = 0.0
    error: str = ""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak_flops(device: torch.device, dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Best FLOP/s of ``size``×``size`` matmuls in ``dtype`` on ``device`` (2·size³ FLOPs each)."""
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


def flops_per_token(model: torch.nn.Module, num_layers: int, hidden: int, seq_length: int) -> float:
    """``6·N + 12·L·h·s`` with N = parameters except embedding tables (see the module docstring)."""
    tables = {id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)}
    matmul_params = sum(p.numel() for p in model.parameters() if id(p) not in tables)
    return 6 * matmul_params + 12 * num_layers * hidden * seq_length


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def build(config_files: list[str], overrides: dict, pos_emb: str, impl: str):
    """The config for one embedding and its model (config checks included)."""
    from kerple.config import load_config
    from kerple.model import build_model

    cfg = load_config(config_files, {**overrides, "pos_emb": pos_emb, "attention_impl": impl})
    torch.manual_seed(cfg.training.seed)
    return cfg, build_model(cfg)


def time_embedding(args: argparse.Namespace, pos_emb: str, device: torch.device, peak_flops: float) -> Result:
    """Build, compile and time one embedding's training steps."""
    from kerple.model import maybe_compile

    result = Result(pos_emb)
    overrides = dict(TINY_OVERRIDES if args.tiny else {})
    overrides.update({"compile": args.compile, "train_iters": 1})
    if args.micro_batch:
        overrides["micro_batch_size"] = args.micro_batch
    if args.seq_length:
        overrides.update({"seq_length": args.seq_length, "max_position_embeddings": args.seq_length})
    cfg, model = build(args.config, overrides, pos_emb, args.attention_impl)
    model = maybe_compile(model.to(device).train(), cfg)
    batch, length = cfg.training.micro_batch_size, cfg.model.seq_length
    result.impl = model.resolve_attention_impl(device.type, True, length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    tokens = torch.randint(0, cfg.model.vocab_size, (batch, length + 1), device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step() -> None:
        with autocast:
            logits = model(tokens[:, :-1])  # [b, s, V]
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        synchronize(device)
        started = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - started)
    result.step_seconds = statistics.median(times)
    result.tokens_per_second = batch * length / result.step_seconds
    result.peak_bytes = peak_bytes(device)
    per_token = flops_per_token(model, cfg.model.num_layers, cfg.model.hidden_size, length)
    result.mfu = result.tokens_per_second * per_token / peak_flops
    return result


def release(device: torch.device) -> None:
    """Drop compiled graphs and cached memory between embeddings."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def print_table(results: list[Result], header: str) -> None:
    print(header)
    print("| pos_emb | attention | step time (s) | tokens/s | peak memory (GiB) | MFU | tokens/s ÷ none |")
    print("|---|---|---:|---:|---:|---:|---:|")
    base = next((r.tokens_per_second for r in results if r.pos_emb == "none" and not r.error), None)
    for r in results:
        if r.error:
            print(f"| {r.pos_emb} | {r.impl or '—'} | — | — | — | — | failed: {r.error} |")
            continue
        ratio = f"{r.tokens_per_second / base:.3f}" if base else "—"
        print(f"| {r.pos_emb} | {r.impl} | {r.step_seconds:.4f} | {r.tokens_per_second:,.0f} | "
              f"{r.peak_bytes / 2**30:.2f} | {100 * r.mfu:.1f}% | {ratio} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", help="model YAML (repeatable); default configs/models/162M.yml")
    parser.add_argument("--pos-emb", default=EMBEDDINGS)
    parser.add_argument("--attention-impl", default="auto")
    parser.add_argument("--micro-batch", type=int, help="default: the config's (32 for 162M)")
    parser.add_argument("--seq-length", type=int, help="default: the config's (512 for 162M)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, help="default: on for CUDA, off for CPU")
    parser.add_argument("--peak-size", type=int, help="matmul size for the peak (default 8192 CUDA, 1024 CPU)")
    parser.add_argument("--tiny", action="store_true", help="tiny model, 2 steps: a CPU smoke check")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    args.config = args.config or ["configs/models/162M.yml"]
    if args.compile is None:
        args.compile = device.type == "cuda"
    if args.tiny:
        args.steps, args.warmup = min(args.steps, 2), min(args.warmup, 1)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = args.peak_size or (8192 if device.type == "cuda" else (256 if args.tiny else 1024))
    peak_flops = measure_peak_flops(device, dtype, size)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    results = []
    for pos_emb in [name.strip() for name in args.pos_emb.split(",") if name.strip()]:
        try:
            results.append(time_embedding(args, pos_emb, device, peak_flops))
        except Exception as error:  # one failing embedding must not hide the others' numbers
            results.append(Result(pos_emb, error=f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"))
        release(device)
        print(f"  done {pos_emb}", file=sys.stderr, flush=True)
    header = (
        f"device: {name}; torch {torch.__version__}; {'tiny model' if args.tiny else ', '.join(args.config)}; "
        f"compile={args.compile}; attention_impl={args.attention_impl}; "
        f"{'bf16 autocast, fused AdamW' if device.type == 'cuda' else 'fp32, AdamW'}; "
        f"median of {args.steps} steps after {args.warmup} warm-up\n"
        f"measured peak: {peak_flops / 1e12:.3f} TFLOP/s ({size}×{size} {str(dtype).removeprefix('torch.')} matmul); "
        f"FLOPs/token = 6·N + 12·L·h·s\n"
    )
    print_table(results, header)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
