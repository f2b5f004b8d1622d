"""Parity Check with RegularGPT: a short CPU training run, tested on lengths that are not powers of two.

    python benchmarks/regular_parity.py [--seeds 1] [--steps 8000] [--padding pad none] [--threshold 0.95]

Thesis Table 6.1 reports 100.0 / 100.0 for RegularGPT (C = 2) on Parity Check, trained on lengths
1-40 and tested on 41-500. This trains the benchmark's tiny RegularGPT (width 64, 4 heads, K = 1) on
lengths 1-40 until its training loss is below ``--stop-loss`` (or ``--steps``), then tests every
``--every``-th length from 41 to 500 that is not a power of two (those need no padding), odd and
even lengths alike. It prints the accuracy per run, overall and by parity of the length, and exits
with status 1 when a run with ``padding pad`` stays below ``--threshold``. ``--padding none`` adds
the earlier reading (keys before position 0 left out) for comparison; it is expected to fail.
"""

from __future__ import annotations

import argparse
import sys

from kerple.errors import UsageError, entry_point
from kerple.flags import AT_LEAST_0, AT_LEAST_1, Bounds, check_flags, check_unique, heavy_imports
from kerple.regular_languages.settings import PADDINGS, RunSettings
from kerple.regular_languages.tasks import get_task

FLAG_BOUNDS = {"--seeds": AT_LEAST_1, "--steps": AT_LEAST_1, "--stop-loss": AT_LEAST_0, "--every": AT_LEAST_1,
               "--eval-samples": AT_LEAST_1, "--threshold": Bounds(above=0, most=1), "--threads": AT_LEAST_1}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="regular_parity.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=RunSettings.steps, help="most training steps")
    parser.add_argument("--stop-loss", type=float, default=RunSettings.stop_loss, help="stop once the training loss is below this")
    parser.add_argument("--padding", nargs="+", default=["pad"], choices=PADDINGS)
    parser.add_argument("--every", type=int, default=3, help="test every n-th length of 41..500")
    parser.add_argument("--eval-samples", type=int, default=32, help="strings per test length")
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    check_flags(args, FLAG_BOUNDS)
    check_unique("--padding", args.padding)
    if args.steps < RunSettings.warmup_steps:
        raise UsageError(f"--steps {args.steps}: fewer than the {RunSettings.warmup_steps} warm-up steps of the "
                         "defaults, so the learning rate would never reach its peak; give at least "
                         f"{RunSettings.warmup_steps}")
    return args


with heavy_imports("regular_parity.py", parse_args if __name__ == "__main__" else None):
    import numpy as np
    import torch

    from kerple.regular_languages.bench import run


def test_lengths(every: int) -> list[int]:
    """Lengths 41..500 that are not powers of two, every ``every``-th one."""
    return [n for n in range(41, 501, every) if n & (n - 1)]


@entry_point("regular_parity.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    task, lengths = get_task("parity_check"), test_lengths(args.every)
    print(f"parity_check: train 1-40, test {len(lengths)} lengths in 41-500 (no power of two), "
          f"{args.eval_samples} strings each; torch {torch.__version__}, {args.threads} thread(s)")
    print("| padding | seed | steps | train s | accuracy 41-500 | odd lengths | even lengths | at 40 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    failed = False
    for padding in args.padding:
        settings = RunSettings(padding=padding, steps=args.steps, stop_loss=args.stop_loss, eval_samples=args.eval_samples)
        for seed in range(args.seeds):
            record = run(task, "regulargpt", seed, settings, lengths)
            by_length = {int(n): a for n, a in record["accuracy"].items()}
            odd = np.mean([a for n, a in by_length.items() if n % 2])
            even = np.mean([a for n, a in by_length.items() if not n % 2])
            print(f"| {padding} | {seed} | {record['steps']} | {record['train_seconds']:.0f} | "
                  f"{100 * record['mean_accuracy']:.1f}% | {100 * odd:.1f}% | {100 * even:.1f}% | "
                  f"{100 * record['train_length_accuracy']:.1f}% |", flush=True)
            failed |= padding == "pad" and record["mean_accuracy"] < args.threshold
    print(f"{'FAIL' if failed else 'PASS'}: padding pad {'below' if failed else 'at or above'} {100 * args.threshold:.0f}%")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
