"""Training speed per positional embedding, the layout of KERPLE paper Table 4 (sec/step).

    python tools/benchmark_speed.py configs/models/162M.yml configs/setups/local_gpu.yml \\
        --pos-emb kerple_log,kerple_power,alibi,rpe,rotary,sinusoidal,none

A thin wrapper over ``benchmarks/train_throughput.py``: the same measurement (every embedding in
one process on the current device, the median of ``--steps`` timed ``Trainer.train_step`` calls
after ``--warmup`` untimed ones; see that script's docstring for what a timed step includes),
printed as one row of seconds per step and, when ``none`` is in the list, a row of ratios to it.
The configs are used as given (no attention or compile defaults are added).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kerple.cli import split_arguments  # noqa: E402
from kerple.errors import UsageError, entry_point, exit_on_interrupt  # noqa: E402
from kerple.flags import AT_LEAST_0, AT_LEAST_1, check_flags, check_unique  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked before torch loads."""
    parser = argparse.ArgumentParser(prog="benchmark_speed.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="YAML files, then key=value overrides")
    parser.add_argument("--pos-emb", default="kerple_log,kerple_power,alibi,rpe,rotary,sinusoidal,none")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    check_flags(args, {"--steps": AT_LEAST_1, "--warmup": AT_LEAST_0})
    args.names = [name.strip() for name in args.pos_emb.split(",") if name.strip()]
    if not args.names:
        raise UsageError(f"--pos-emb {args.pos_emb!r}: name at least one embedding")
    check_unique("--pos-emb", args.names)
    return args


@entry_point("benchmark_speed.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with exit_on_interrupt("benchmark_speed.py"):
        from benchmarks.train_throughput import describe, measure
        from kerple.measure.training import check_embeddings
        from kerple.config import parse_overrides
    check_embeddings("--pos-emb", args.names)
    yamls, overrides = split_arguments(args.configs)
    names = args.names
    run = measure(yamls, parse_overrides(overrides), names, steps=args.steps, warmup=args.warmup)
    seconds = {r.pos_emb: r.step_seconds for r in run.results if not r.error}
    width = max(12, *(len(n) + 2 for n in names))
    print(describe(run, yamls))
    print(" " * 14 + "".join(f"{n:>{width}}" for n in names))
    print(f"{'sec/step':<14}" + "".join(f"{seconds[n]:>{width}.4f}" if n in seconds else f"{'failed':>{width}}"
                                        for n in names))
    if "none" in seconds:
        print(f"{'ratio to none':<14}" + "".join(f"{seconds[n] / seconds['none']:>{width}.3f}" if n in seconds
                                                 else f"{'-':>{width}}" for n in names))
    for r in run.results:
        if r.error:
            print(f"{r.pos_emb}: failed: {r.error}", file=sys.stderr)
    return 1 if len(seconds) < len(names) else 0


if __name__ == "__main__":
    sys.exit(main())
