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

from benchmarks.train_throughput import describe, measure  # noqa: E402
from kerple.config import parse_overrides, split_arguments  # noqa: E402
from kerple.errors import entry_point  # noqa: E402


@entry_point("benchmark_speed.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="YAML files, then key=value overrides")
    parser.add_argument("--pos-emb", default="kerple_log,kerple_power,alibi,rpe,rotary,sinusoidal,none")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    yamls, overrides = split_arguments(args.configs)
    names = [name.strip() for name in args.pos_emb.split(",") if name.strip()]
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
