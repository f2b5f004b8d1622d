"""Registers, spills and shared memory of the project's Triton kernels on an NVIDIA GPU, compiled here.

    python benchmarks/triton_resources.py                         # the bias-gradient reduction
    python benchmarks/triton_resources.py --kernel attention      # attention_impl: triton's three kernels

No GPU is needed: :mod:`kerple.measure.triton_offline` compiles each launch configuration for
``sm_<arch>`` with Triton and the ``ptxas`` its wheel carries, and reads ``ptxas -v``. One row per
configuration of :func:`kerple.model.bias_gradient_triton.diagonal_partials` (dtype, head_dim, a scale
table or not) x warps per program x the order of the diagonal sums (once per program, the default, or
per tile). A spill is local memory traffic inside the kernel's loop; fewer registers a thread leave room
for more programs per SM. "async copies" counts the ``cp.async`` instructions of Triton's software
pipelining (0: every load waits before the compute that reads it); "tensor cores" names the MMA
instructions (wgmma on Hopper, mma.sync otherwise, none for fp32 at ``ieee`` precision). Time still needs a
GPU (``benchmarks/bias_gradient.py``). About 10-20 s per configuration on a CPU, cached by Triton after
the first run. ``--kernel attention``: the forward and the two
backward kernels of :mod:`kerple.model.triton_attention_kernels` per dtype x head_dim x tables x warps, at 512
tokens without a window.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from kerple.errors import entry_point
from kerple.flags import AT_LEAST_1, name_list, number_list

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dtypes", default="bf16", help=f"comma-separated: {', '.join(DTYPES)}")
    parser.add_argument("--head-dims", default="64,128", help="comma-separated head dimensions")
    parser.add_argument("--warps", default="4,8", help="comma-separated warps per program")
    parser.add_argument("--arch", type=int, default=90, choices=(80, 90), help="sm_80 (A100) or sm_90 (H100, H200)")
    parser.add_argument("--kernel", default="bias-gradient", choices=("bias-gradient", "attention"),
                        help="the tables' reduction, or the fused attention kernels of attention_impl: triton")
    args = parser.parse_args(argv)
    args.dtypes = name_list("--dtypes", args.dtypes, list(DTYPES))
    args.head_dims = number_list("--head-dims", args.head_dims, AT_LEAST_1)
    args.warps = number_list("--warps", args.warps, AT_LEAST_1)
    return args


@entry_point("triton_resources.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kernel == "attention":
        return _attention(args)
    from kerple.measure.triton_offline import kernel_resources
    from kerple.model.bias_gradient_triton import GATHER_EACH_TILE, WARPS, offline_request, tile_size

    cases = list(itertools.product(args.dtypes, args.head_dims, (False, True), args.warps, (False, True)))
    requests = [offline_request(DTYPES[dtype], head_dim, scale, num_warps=warps, gather_each_tile=each)
                for dtype, head_dim, scale, warps, each in cases]
    for request in requests:
        request["arch"] = args.arch
    print(f"bias-gradient kernel for sm_{args.arch}, compiled offline ({len(cases)} configurations); "
          "launched: what diagonal_partials launches\n")
    heads = []
    for dtype, head_dim, scale, count, each in cases:
        tile = tile_size(DTYPES[dtype], head_dim)
        launched = count == WARPS and each == GATHER_EACH_TILE
        heads.append(f"| {dtype} | {head_dim} | {tile} | {'bias, scale' if scale else 'bias'} | {count} | "
                     f"{'per tile' if each else 'per program'} | {'yes' if launched else ''} |")
    _print_resources("diagonal sums", heads, kernel_resources(requests))
    return 0


def _print_resources(sixth: str, heads: list[str], found: list) -> None:
    """The table: each row's first seven cells (``heads``), then what compiling it used (``found``)."""
    print(f"| dtype | head_dim | tile | tables | warps | {sixth} | launched | registers | spill stores / loads (B) "
          "| shared (KiB) | async copies | tensor cores |")
    print("|---|---:|---:|---|---:|---|---|---:|---:|---:|---:|---|")
    for head, resources in zip(heads, found):
        if resources.error:
            print(f"{head} did not compile: {resources.error} | | | | |")
        else:
            print(f"{head} {resources.registers} | {resources.spill_stores} / {resources.spill_loads} | "
                  f"{resources.shared_bytes / 1024:g} | {resources.async_copies} | {resources.tensor_cores or 'none'} |")


def _attention(args: argparse.Namespace) -> int:
    """One row per kernel of ``attention_impl: triton`` and configuration."""
    from kerple.measure.triton_offline import kernel_resources
    from kerple.model.triton_attention_kernels import launch_settings, offline_requests

    cases = list(itertools.product(args.dtypes, args.head_dims, (False, True), args.warps))
    rows = [(case, name, request) for case in cases
            for name, request in offline_requests(DTYPES[case[0]], case[1], case[2], num_warps=case[3]).items()]
    for _, _, request in rows:
        request["arch"] = args.arch
    print(f"attention_impl: triton for sm_{args.arch}, compiled offline ({len(rows)} kernels, 512 tokens); "
          "launched: the warps attention_forward/attention_backward launch\n")
    heads = []
    for (dtype, head_dim, scale, count), name, _ in rows:
        settings = launch_settings(DTYPES[dtype], head_dim, 512, True, scale, None)
        launched = "yes" if count == settings["num_warps"] else ""
        heads.append(f"| {dtype} | {head_dim} | {settings['BLOCK']} | {'bias, scale' if scale else 'bias'} | {count} | "
                     f"{name} | {launched} |")
    _print_resources("kernel", heads, kernel_resources([r for *_, r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
