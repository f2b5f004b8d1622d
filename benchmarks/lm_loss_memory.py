"""Peak memory and time of the LM head and its loss, fused (``kerple.model.lm_loss``) against unfused, in one run.

    python benchmarks/lm_loss_memory.py                         # 32 x 512 tokens, vocabulary 50,304, h 768, bf16
    python benchmarks/lm_loss_memory.py --tokens 4096 --dtype fp32

One forward and backward of the loss alone, from hidden states ``[tokens, h]`` and an LM-head
weight ``[V, h]`` that both need gradients: unfused is what the trainer computed before,
``F.cross_entropy(F.linear(hidden, weight).float(), labels)``; fused is
:func:`kerple.model.lm_loss.linear_cross_entropy`. Each variant runs in a fresh process; the peak is
the allocator's (CUDA: ``max_memory_allocated``) or, on a CPU, the growth of the process's peak
resident set over what the inputs alone take, so it counts every tensor the loss and its backward
hold at once. The inputs and the gradients that outlive the loss (``[tokens, h]`` and ``[V, h]``)
are included in both. ``fused, compiled`` is the fused loss with ``compiled=True`` (what ``compile: true``
trains with): its peak is taken after a first, compiling call (on a CPU the resident set cannot be
reset after it, so its peak is not shown there). Time: the median of ``--repeats`` forward + backward
calls after that first one.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

from kerple.errors import entry_point

DTYPES = ("bf16", "fp32")
VARIANTS = ("unfused", "fused", "fused, compiled")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def measure_here(variant: str, tokens: int, vocab: int, hidden_size: int, dtype_name: str,
                 repeats: int) -> dict[str, float]:
    """Peak bytes and median milliseconds of a forward + backward of ``variant`` in this process (see
    the module docstring)."""
    import torch
    import torch.nn.functional as F

    from kerple.measure.device import median_seconds
    from kerple.model.lm_loss import linear_cross_entropy

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, device=device, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, device=device, generator=generator) * 0.02).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=generator)

    def step() -> torch.Tensor:
        hidden.grad = weight.grad = None
        if variant == "unfused":
            loss = F.cross_entropy(F.linear(hidden, weight).float(), labels)
        else:
            loss = linear_cross_entropy(hidden, weight, labels, compiled=variant == "fused, compiled")
        loss.backward()
        return loss

    compiled = variant == "fused, compiled"
    if compiled:
        step()  # compiles
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _peak_rss()
    loss = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = float(torch.cuda.max_memory_allocated() - base)
    else:
        peak = float("nan") if compiled else float(_peak_rss() - base)
    return {"peak_bytes": peak, "loss": float(loss), "ms": 1e3 * median_seconds(step, repeats, device)}


@entry_point("lm_loss_memory.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32 * 512, help="positions (default 32 x 512)")
    parser.add_argument("--vocab", type=int, default=50304, help="vocabulary (default 50,304: GPT-2's, padded)")
    parser.add_argument("--hidden", type=int, default=768, help="hidden size (default 768: the 162M model)")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per variant (default 3)")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args(argv)
    if min(args.tokens, args.vocab, args.hidden, args.repeats) < 1:
        parser.error("--tokens, --vocab, --hidden and --repeats must be >= 1")
    if args.variant:
        print(json.dumps(measure_here(args.variant, args.tokens, args.vocab, args.hidden, args.dtype, args.repeats)))
        return 0
    results = {}
    for variant in VARIANTS:
        command = [sys.executable, __file__, "--variant", variant, "--tokens", str(args.tokens), "--vocab",
                   str(args.vocab), "--hidden", str(args.hidden), "--dtype", args.dtype, "--repeats", str(args.repeats)]
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
    print("| variant | peak (GiB) | ms | loss |")
    print("|---|---:|---:|---:|")
    for variant, result in results.items():
        peak = "n/a" if result["peak_bytes"] != result["peak_bytes"] else f"{result['peak_bytes'] / 2**30:.2f}"
        print(f"| {variant} | {peak} | {result['ms']:.1f} | {result['loss']:.4f} |")
    ratio = results["fused"]["peak_bytes"] / results["unfused"]["peak_bytes"]
    speed = results["fused"]["ms"] / results["fused, compiled"]["ms"]
    print(f"fused / unfused peak: {ratio:.3f}; compiled chunk terms: {speed:.2f}x the speed of the eager ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
