"""The cost of a learnable attention bias, taken apart: attention alone and the bias gradient alone.

    python benchmarks/bias_attention.py [--shape 4,4,512,32] [--rounds 15] [--threads 1] [--blocks 64,128,256]

Attention forward + backward of ``[batch, heads, length, head_dim]`` fp32 inputs, causal, on the
current CPU, each variant timed in the same rounds (rotated order; median over rounds):

* ``causal``: ``scaled_dot_product_attention(is_causal=True)``, the cost of ``none``;
* ``fixed mask``: the same with a float mask that needs no gradient (ALiBi), through ``F.sdpa``
  (before) and through ``sdpa_cpu.masked_attention`` (now: causal tiles skipped);
* ``mask grad, F.sdpa``: the mask built as before (index gather of the ``[H, L]`` table,
  ``masked_fill``) and differentiated through ``F.scaled_dot_product_attention``, which falls back to
  its unfused math path;
* ``mask grad, sdpa_cpu``: the model's path now (the mask gathered from its diagonals, the gradient
  returned to the diagonals by ``sdpa_cpu.masked_attention``), once per ``--blocks`` value of
  ``BACKWARD_BLOCK``.

Then the table gradient alone: autograd of an index gather ``table[:, d]`` (``index_put_`` with
accumulation over L² indices) against :func:`kerple.positional.base.diagonal_sums`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

from kerple.errors import entry_point
from kerple.flags import AT_LEAST_1, check_flags, heavy_imports, number_list, shape_flag


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="bias_attention.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="4,4,512,32", help="batch,heads,length,head_dim")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's)")
    parser.add_argument("--blocks", help="BACKWARD_BLOCK values to time (default: sdpa_cpu's own)")
    args = parser.parse_args(argv)
    check_flags(args, {"--rounds": AT_LEAST_1, "--threads": AT_LEAST_1})
    args.shape_values = shape_flag("--shape", args.shape, ("batch", "heads", "length", "head_dim"))
    args.block_values = None if args.blocks is None else number_list("--blocks", args.blocks, AT_LEAST_1)
    return args


with heavy_imports("bias_attention.py", parse_args if __name__ == "__main__" else None):
    import torch
    import torch.nn.functional as F

    from kerple.model import sdpa_cpu
    from kerple.positional.base import causal_distances, diagonal_gather, diagonal_sums


def _variants(shape: list[int], blocks: list[int]) -> dict[str, Callable[[], None]]:
    batch, heads, length, dim = shape
    generator = torch.Generator().manual_seed(0)
    q, k, v, upstream = (torch.randn(batch, heads, length, dim, generator=generator) for _ in range(4))
    table = -torch.rand(heads, 1, generator=generator) * torch.log1p(torch.arange(length, dtype=torch.float32))
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    distance = causal_distances(length, length)

    def attention(mask_of: Callable[[torch.Tensor], torch.Tensor | None], kernel: Callable) -> Callable[[], None]:
        def run() -> None:
            inputs = [t.clone().requires_grad_() for t in (q, k, v, table)]
            output = kernel(*inputs[:3], mask_of(inputs[3]))
            output.backward(upstream)
        return run

    def sdpa(query, key, value, mask):  # type: ignore[no-untyped-def]
        if mask is None:
            return F.scaled_dot_product_attention(query, key, value, is_causal=True)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask)

    def diagonals(values: torch.Tensor) -> torch.Tensor:
        return torch.cat([values.new_full((heads, length - 1), float("-inf")), values], dim=-1)

    fixed = table[:, distance].masked_fill(~causal, float("-inf"))[None]
    variants = {
        "causal": attention(lambda t: None, sdpa),
        "fixed mask": attention(lambda t: fixed, sdpa),
        "fixed mask, sdpa_cpu": attention(lambda t: fixed, lambda *a: sdpa_cpu.masked_attention(*a)),
        "mask grad, F.sdpa": attention(lambda t: t[:, distance].masked_fill(~causal, float("-inf"))[None], sdpa),
    }
    for block in blocks:
        def masked(query, key, value, values, block=block):  # type: ignore[no-untyped-def]
            sdpa_cpu.BACKWARD_BLOCK = block
            mask = diagonal_gather(values.detach(), length, length)[None]
            return sdpa_cpu.masked_attention(query, key, value, mask, values)
        variants[f"mask grad, sdpa_cpu (block {block})"] = attention(diagonals, masked)
    grad = torch.randn(heads, length, length, generator=generator)
    leaf = table.clone().requires_grad_()
    variants["table grad: index gather backward"] = lambda: torch.autograd.grad(leaf[:, distance], leaf, grad)
    variants["table grad: diagonal sums"] = lambda: diagonal_sums(grad)
    return variants


@entry_point("bias_attention.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    default_block = sdpa_cpu.BACKWARD_BLOCK
    variants = _variants(args.shape_values, args.block_values or [default_block])
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_index in range(args.rounds + 1):  # round 0 warms up
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            variants[name]()
            if round_index:
                times[name].append(time.perf_counter() - started)
    sdpa_cpu.BACKWARD_BLOCK = default_block
    base = statistics.median(times["causal"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, shape {args.shape}, "
          f"median of {args.rounds} rounds (rotated order)\n")
    print("| variant | ms | vs causal |\n|---|---:|---:|")
    for name in names:
        median = statistics.median(times[name])
        print(f"| {name} | {median * 1e3:.2f} | {median / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
