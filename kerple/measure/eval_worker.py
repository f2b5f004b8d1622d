"""The measuring subprocess of :mod:`kerple.measure.eval_memory`: one (implementation, length) cell.

    python -m kerple.measure.eval_worker --impl flex --length 16384 --device cuda [--config 162M.yml]

prints one JSON line: ``peak_bytes``, ``seconds``, ``loss`` and ``method``, or ``error``. It builds
the model, warms up (FlexAttention is compiled once per length, so its warm-up calls the kernel at
the measured length; eager and sdpa warm up at 256 tokens), then measures one
``model.chunked_loss`` of batch 1:

* CPU: the growth of the resident set over the measured call: the high-water mark ``VmHWM`` is
  reset through ``/proc/self/clear_refs`` after the warm-up and read back afterwards (minus the
  resident set before the call); the driver sets glibc to return freed blocks to the OS. Where
  ``clear_refs`` is not writable, ``ru_maxrss`` of the whole process is reported instead.
* CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation before the call (bf16 autocast).

One-time per-length work done in the warm-up is not in the figure: compilation and the cached
FlexAttention block mask (O((L/128)²), see ``kerple/model/flex.py``).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from kerple.errors import entry_point
from kerple.measure.eval_memory import load_model_config
from kerple.model.attention import ATTENTION_IMPLS


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


def _autocast(device: torch.device) -> AbstractContextManager[Any]:
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def _warm_up(model: Any, impl: str, length: int, device: torch.device, vocab: int) -> None:
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


def measure_cell(configs: list[str], pos_emb: str, impl: str, length: int, device_name: str,
                 chunk_size: int) -> dict:
    """Measure one (impl, length) in this process (module docstring); the JSON-able result."""
    from kerple.model import build_model

    device = torch.device(device_name)
    cfg = load_model_config(configs, pos_emb)
    torch.manual_seed(0)
    model = build_model(cfg).to(device).eval()
    model.set_attention(impl)
    vocab = cfg.model.vocab_size
    _warm_up(model, impl, length, device, vocab)
    tokens = torch.randint(0, vocab, (1, length + 1), generator=torch.Generator().manual_seed(1))
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
            loss = model.chunked_loss(tokens[:, :-1], tokens[:, 1:], chunk_size=chunk_size).mean().item()
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


@entry_point("eval_memory.py")
def main(argv: list[str] | None = None) -> int:
    """The flags :func:`kerple.measure.eval_memory.run_one` passes; the result as the last stdout line."""
    parser = argparse.ArgumentParser(prog="python -m kerple.measure.eval_worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", required=True, choices=ATTENTION_IMPLS)
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--device", required=True, help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--pos-emb", required=True)
    parser.add_argument("--chunk-size", type=int, required=True)
    parser.add_argument("--config", action="append", default=[], help="model YAML (repeatable); none: the tiny model")
    args = parser.parse_args(argv)
    print(json.dumps(measure_cell(args.config, args.pos_emb, args.impl, args.length, args.device, args.chunk_size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
