"""What the gradient of a learnable bias costs inside FlexAttention, with and without spreading.

    python benchmarks/flex_gradient_spread.py                     # CUDA: the 162M attention shape, bf16
    python benchmarks/flex_gradient_spread.py --shape 2,4,256,64  # batch,heads,length,head_dim

One attention forward + backward of causal ``[batch, heads, length, head_dim]`` inputs per variant,
timed between device synchronisations (median of ``--repeats`` after ``--warmup``), each variant in
the same run:

* ``sdpa, no bias``: ``scaled_dot_product_attention(is_causal=True)`` (the cost of ``none``);
* ``sdpa, bias grad``: the KERPLE-log bias ``-r1·log(1 + r2·d)`` built as an ``[H, L, L]`` mask and
  differentiated through sdpa (what ``attention_impl: sdpa`` does);
* ``flex, width W``: compiled FlexAttention with the bias in ``score_mod``, ``r1`` and ``r2``
  captured spread ``W`` copies wide (:func:`kerple.positional.logit_term.spread`; ``W = 1`` is one
  address per head, where every score's gradient lands), with the kernel options the model chooses
  for that many gathered bytes (:mod:`kerple.model.flex_options`).

Measured on an H200 (docs/gpu-report.md, before the options were passed): sdpa without bias 0.50 ms,
sdpa with the bias gradient 1.62 ms, flex at width 1 179.63 ms; width 16 then failed to compile
(PyTorch's default tiles do not fit the gathered tiles).

Printed: milliseconds and the ratio to ``sdpa, no bias``. On a CPU FlexAttention has no backward; the
benchmark says so and exits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kerple.errors import entry_point  # noqa: E402
from kerple.flags import AT_LEAST_0, AT_LEAST_1, check_flags, heavy_imports, number_list, shape_flag  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="flex_gradient_spread.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--shape", default="32,12,512,64", help="batch,heads,length,head_dim (default: 162M's)")
    parser.add_argument("--widths", default="1,16,256", help="spread widths to time")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    check_flags(args, {"--warmup": AT_LEAST_0, "--repeats": AT_LEAST_1})
    args.shape = shape_flag("--shape", args.shape, ("batch", "heads", "length", "head_dim"))
    args.widths = number_list("--widths", args.widths, AT_LEAST_1)
    return args


with heavy_imports("flex_gradient_spread.py", parse_args if __name__ == "__main__" else None):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    from kerple.model.flex import distance_block_mask
    from kerple.model.flex_options import choose_configs, device_limits, kernel_options
    from kerple.positional.logit_term import (
        ScorePosition, causal_distance, gathered_bytes, read_spread, spread,
    )


def kerple_log(r1: torch.Tensor, r2: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """KERPLE paper §4 (log variant): ``-r1·log(1 + r2·d)``."""
    return -r1 * torch.log1p(r2 * distance)


def _timed(run: Callable[[], None], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def variants(shape: list[int], widths: list[int]) -> dict[str, Callable[[], None]]:
    """The timed functions, each one forward and backward (see the module docstring)."""
    batch, heads, length, dim = shape
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, upstream = (torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16,
                                     generator=generator) for _ in range(4))
    r1 = torch.rand(heads, device="cuda", requires_grad=True)
    r2 = torch.rand(heads, device="cuda", requires_grad=True)
    block_mask = distance_block_mask(length, length, None, "cuda")
    compiled = torch.compile(flex_attention, dynamic=False)
    position = torch.arange(length, device="cuda")
    distance = (position[:, None] - position[None, :]).clamp(min=0).float()
    causal = position[:, None] >= position[None, :]

    def inputs() -> list[torch.Tensor]:
        return [t.detach().requires_grad_() for t in (q, k, v)]

    def sdpa(bias: bool) -> Callable[[], None]:
        def run() -> None:
            query, key, value = inputs()
            mask = None
            if bias:
                mask = kerple_log(r1[:, None, None], r2[:, None, None], distance).masked_fill(~causal, float("-inf"))
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=None if mask is None else
                                                 mask.to(query.dtype), is_causal=mask is None)
            out.backward(upstream)
        return run

    def flex(width: int) -> Callable[[], None]:
        gathered = gathered_bytes((spread(r1, width), spread(r2, width)))
        # the model's own option choice: a spread tensor is a gathered tile (PyTorch's default tiles
        # asked for 376,832 bytes of shared memory on an H200 for width 16, over its 232,448)
        limits = device_limits(q.device)
        options = kernel_options(*choose_configs(limits, dim, q.dtype, gathered)) if limits else None

        def run() -> None:
            query, key, value = inputs()
            a, b = spread(r1, width), spread(r2, width)

            def score_mod(score, batch_, head, q_idx, kv_idx):  # type: ignore[no-untyped-def]
                where = ScorePosition(batch_, head, q_idx, kv_idx)
                return score + kerple_log(read_spread(a, where, head), read_spread(b, where, head), causal_distance(where))

            compiled(query, key, value, score_mod=score_mod, block_mask=block_mask,
                     kernel_options=options).backward(upstream)
        return run

    table = {"sdpa, no bias": sdpa(False), "sdpa, bias grad": sdpa(True)}
    table.update({f"flex, width {width}": flex(width) for width in widths})
    return table


@entry_point("flex_gradient_spread.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("flex_gradient_spread.py: error: FlexAttention has no backward on a CPU; run it on a CUDA GPU", file=sys.stderr)
        return 2
    shape, widths = args.shape, args.widths
    print(f"{torch.cuda.get_device_name()}, bf16, shape {shape}: forward + backward, median of {args.repeats}")
    baseline = None
    for name, run in variants(shape, widths).items():
        seconds = _timed(run, args.warmup, args.repeats)
        baseline = baseline or seconds
        print(f"  {name:<18} {seconds * 1e3:9.2f} ms   x{seconds / baseline:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
