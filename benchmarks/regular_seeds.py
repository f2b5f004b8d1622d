"""How many seeds learn a regular language with the tool's default budget (RegularGPT, thesis Table 6.1).

    python benchmarks/regular_seeds.py --jobs 2              # Parity Check, seeds 100-109, the defaults
    python benchmarks/regular_seeds.py --task even_pairs cycle_navigation --seeds 3 --output results/seeds.json

Each seed trains the RegularGPT of :class:`~kerple.regular_languages.bench.RunSettings` (the
defaults of ``tools/regular_languages.py``: C = 2, K = 1, width 64, Adam with a warm-up, stop at
the training loss ``stop_loss`` or after ``steps``) on the task's training lengths, then tests it on every test
length (41-500, or 51-100 for D_n and Tomita; ``--every`` subsamples them). The seeds are fixed
before looking: 100-109 by default (0-19 served to find the defaults). Prints one row per seed
(steps, training and test seconds, accuracy at the longest training length and over the test
lengths) and, per task, how many seeds reach ``--threshold`` with the median steps and seconds.
Exits with status 1 when fewer than ``--expect`` seeds of a task reach it. ``--output`` keeps the
records (rewritten after every seed; ``--resume`` skips the seeds it already holds). ``--jobs``
runs that many seeds at once, one thread each (a seed's result does not depend on it).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from kerple import atomic
from kerple.errors import UsageError, children_ignore_interrupt, entry_point, future_result
from kerple.flags import AT_LEAST_0, AT_LEAST_1, Bounds, check_flags, check_not_more, check_unique, heavy_imports
from kerple.outputs import check_output_file
from kerple.regular_languages.settings import RunSettings, resume_conflict
from kerple.regular_languages.tasks import TASKS, get_task

FLAG_BOUNDS = {"--first-seed": AT_LEAST_0, "--seeds": AT_LEAST_1, "--every": AT_LEAST_1, "--threads": AT_LEAST_1,
               "--jobs": AT_LEAST_1, "--expect": AT_LEAST_0, "--threshold": Bounds(above=0, most=1)}
EXPECTED_SHARE = 0.9
"""Default of ``--expect``: 9 of every 10 seeds (the defaults learn Parity Check from 10 of 10)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked (a bad one is refused before torch loads)."""
    parser = argparse.ArgumentParser(prog="regular_seeds.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", nargs="+", default=["parity_check"], choices=list(TASKS))
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--every", type=int, default=1, help="test every n-th test length")
    parser.add_argument("--threshold", type=float, default=0.95, help="accuracy over the test lengths that counts")
    parser.add_argument("--expect", type=int,
                        help="least number of seeds per task at the threshold (default: 90%% of --seeds, rounded up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per seed")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once (processes)")
    parser.add_argument("--output", help="records JSON (rewritten after every seed)")
    parser.add_argument("--resume", action="store_true", help="keep the seeds --output already holds")
    args = parser.parse_args(argv)
    check_flags(args, FLAG_BOUNDS)
    check_unique("--task", args.task)
    check_not_more("--expect", args.expect, "--seeds", args.seeds, "no run could ever pass; give at most --seeds")
    if args.expect is None:
        args.expect = math.ceil(EXPECTED_SHARE * args.seeds)
    if args.resume and not args.output:
        raise UsageError("--resume keeps the seeds --output holds: give --output")
    if args.output:
        check_output_file(args.output, "--output")
    return args


with heavy_imports("regular_seeds.py", parse_args if __name__ == "__main__" else None):
    import numpy as np
    import torch

    from kerple.regular_languages.bench import run


def one_seed(name: str, seed: int, lengths: list[int], threads: int) -> dict:
    """Train and test one seed (in a worker process of its own)."""
    torch.set_num_threads(threads)
    return run(get_task(name), "regulargpt", seed, RunSettings(), lengths)


def seed_results(jobs: list[tuple[str, int]], args: argparse.Namespace) -> Iterator[dict]:
    """Each (task, seed)'s record in order: in this process with ``--jobs 1``, else in a pool."""
    if args.jobs == 1:
        for name, seed in jobs:
            yield one_seed(name, seed, test_lengths(name, args.every), args.threads)
        return
    # workers ended by Ctrl-C leave the semaphores of their progress bars to multiprocessing's tracker,
    # which frees them and would warn about it under the "interrupted" line
    os.environ.setdefault("PYTHONWARNINGS", "ignore:resource_tracker:UserWarning")
    with children_ignore_interrupt():  # the workers start here; Ctrl-C stops this process, which ends them
        pool = multiprocessing.get_context("spawn").Pool(args.jobs)
    try:
        handles = [pool.apply_async(one_seed, (name, seed, test_lengths(name, args.every), args.threads))
                   for name, seed in jobs]
        for handle in handles:
            yield future_result(handle)
    finally:  # a result, an error or Ctrl-C: the workers end, and their queues are released
        pool.terminate()
        pool.join()


def row(record: dict, threshold: float) -> str:
    """One seed's line of the table."""
    return (f"| {record['task']} | {record['seed']} | {record['steps']} | {record['train_seconds']:.0f} | "
            f"{record['test_seconds']:.0f} | {100 * record['train_length_accuracy']:.1f}% | "
            f"{100 * record['mean_accuracy']:.1f}% | {'yes' if record['mean_accuracy'] >= threshold else 'no'} |")


def test_lengths(name: str, every: int) -> list[int]:
    """Every ``every``-th test length of the task."""
    return list(get_task(name).test_lengths)[::every]


@entry_point("regular_seeds.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = RunSettings()
    output = Path(args.output) if args.output else None
    records = json.loads(output.read_text())["results"] if output and args.resume and output.is_file() else []
    for record in records:
        conflict = resume_conflict(record, settings, test_lengths(record["task"], args.every))
        if conflict:
            raise UsageError(f"--resume: {output} holds {conflict}; resume with the same --every, or write to another "
                             "--output")
    print(f"RegularGPT, defaults: lr {settings.learning_rate:g} after {settings.warmup_steps} warm-up steps, batch {settings.batch_size}, width {settings.hidden_size}, "
          f"at most {settings.steps} steps, stop at loss {settings.stop_loss:g}, {settings.eval_samples} strings per test "
          f"length; torch {torch.__version__}, {args.jobs} seed(s) at once, {args.threads} thread(s) each")
    print("| task | seed | steps | train s | test s | at train length | test lengths | ≥ threshold |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    jobs = [(name, seed) for name in args.task for seed in range(args.first_seed, args.first_seed + args.seeds)
            if not any(r["task"] == name and r["seed"] == seed for r in records)]
    for record in seed_results(jobs, args):
        records.append(record)
        print(row(record, args.threshold), flush=True)
        if output:
            atomic.write_json_atomic(output, {"results": records})
    short = False
    for name in args.task:
        mine = sorted((r for r in records if r["task"] == name and args.first_seed <= r["seed"] < args.first_seed + args.seeds),
                      key=lambda r: r["seed"])
        reached = sum(r["mean_accuracy"] >= args.threshold for r in mine)
        short |= reached < args.expect
        lengths = test_lengths(name, args.every)
        print(f"{name}: {reached} of {len(mine)} seeds at or above {100 * args.threshold:.0f}% on lengths "
              f"{lengths[0]}-{lengths[-1]}; steps {min(r['steps'] for r in mine)}-{max(r['steps'] for r in mine)} "
              f"(median {np.median([r['steps'] for r in mine]):.0f}), {np.median([r['train_seconds'] for r in mine]):.0f} s "
              f"training and {np.median([r['test_seconds'] for r in mine]):.0f} s testing per seed (median)", flush=True)
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
