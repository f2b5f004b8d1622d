"""Peak memory of the LM head and its loss, fused (``kerple.model.lm_loss``) against unfused, in one run.

    python benchmarks/lm_loss_memory.py                         # 32 x 512 tokens, vocabulary 50,304, h 768, bf16
    python benchmarks/lm_loss_memory.py --tokens 4096 --dtype fp32

One forward and backward of the loss alone, from hidden states ``[tokens, h]`` and an LM-head
weight ``[V, h]`` that both need gradients: unfused is what the trainer computed before,
``F.cross_entropy(F.linear(hidden, weight).float(), labels)``; fused is
:func:`kerple.model.lm_loss.linear_cross_entropy`. Each variant runs in a fresh process; the peak is
the allocator's (CUDA: ``max_memory_allocated``) or, on a CPU, the growth of the process's peak
resident set over what the inputs alone take, so it counts every tensor the loss and its backward
hold at once. The inputs and the gradients that outlive the loss (``[tokens, h]`` and ``[V, h]``)
are included in both.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kerple.errors import entry_point  # noqa: E402

DTYPES = ("bf16", "fp32")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def measure_here(variant: str, tokens: int, vocab: int, hidden_size: int, dtype_name: str) -> dict[str, float]:
    """Peak bytes of one forward + backward of ``variant`` in this process (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    from kerple.model.lm_loss import linear_cross_entropy

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, device=device, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, device=device, generator=generator) * 0.02).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _peak_rss()
    if variant == "fused":
        loss = linear_cross_entropy(hidden, weight, labels)
    else:
        loss = F.cross_entropy(F.linear(hidden, weight).float(), labels)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _peak_rss() - base
    return {"peak_bytes": float(peak), "loss": float(loss)}


@entry_point("lm_loss_memory.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32 * 512, help="positions (default 32 x 512)")
    parser.add_argument("--vocab", type=int, default=50304, help="vocabulary (default 50,304: GPT-2's, padded)")
    parser.add_argument("--hidden", type=int, default=768, help="hidden size (default 768: the 162M model)")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--variant", choices=("fused", "unfused"), help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args(argv)
    if min(args.tokens, args.vocab, args.hidden) < 1:
        parser.error("--tokens, --vocab and --hidden must be >= 1")
    if args.variant:
        print(json.dumps(measure_here(args.variant, args.tokens, args.vocab, args.hidden, args.dtype)))
        return 0
    results = {}
    for variant in ("unfused", "fused"):
        command = [sys.executable, __file__, "--variant", variant, "--tokens", str(args.tokens), "--vocab",
                   str(args.vocab), "--hidden", str(args.hidden), "--dtype", args.dtype]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"lm_loss_memory.py: {variant} failed ({done.returncode}): {done.stderr.strip()[-300:]}",
                  file=sys.stderr)
            return 1
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (peak resident set growth)"
    print(f"device: {device}; {args.tokens} tokens x vocabulary {args.vocab}, h {args.hidden}, {args.dtype}; "
          "forward + backward of the loss alone")
    print("| variant | peak (GiB) | loss |")
    print("|---|---:|---:|")
    for variant, result in results.items():
        print(f"| {variant} | {result['peak_bytes'] / 2**30:.2f} | {result['loss']:.4f} |")
    ratio = results["fused"]["peak_bytes"] / results["unfused"]["peak_bytes"]
    print(f"fused / unfused peak: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
