"""How many seeds learn a regular language with the tool's default budget (RegularGPT, thesis Table 6.1).

    python benchmarks/regular_seeds.py --jobs 2              # Parity Check, seeds 100-109, the defaults
    python benchmarks/regular_seeds.py --task even_pairs cycle_navigation --seeds 3 --output results/seeds.json

Each seed trains the RegularGPT of :class:`~kerple.regular_languages.bench.RunSettings` (the
defaults of ``tools/regular_languages.py``: C = 2, K = 1, width 64, Adam with a warm-up, stop at
the training loss ``stop_loss`` or after ``steps``) on the task's training lengths, then tests it on every test
length (41-500, or 51-100 for D_n and Tomita; ``--every`` subsamples them). The seeds are fixed
before looking: 100-109 by default (0-9 served to find the defaults). Prints one row per seed
(steps, training and test seconds, accuracy at the longest training length and over the test
lengths) and, per task, how many seeds reach ``--threshold`` with the median steps and seconds.
Exits with status 1 when fewer than ``--expect`` seeds of a task reach it. ``--output`` keeps the
records (rewritten after every seed; ``--resume`` skips the seeds it already holds). ``--jobs``
runs that many seeds at once, one thread each (a seed's result does not depend on it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from kerple import atomic
from kerple.regular_languages.bench import RunSettings, run
from kerple.regular_languages.tasks import TASKS, get_task


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
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one_seed, name, seed, test_lengths(name, args.every), args.threads) for name, seed in jobs]
        for future in futures:
            yield future.result()


def row(record: dict, threshold: float) -> str:
    """One seed's line of the table."""
    return (f"| {record['task']} | {record['seed']} | {record['steps']} | {record['train_seconds']:.0f} | "
            f"{record['test_seconds']:.0f} | {100 * record['train_length_accuracy']:.1f}% | "
            f"{100 * record['mean_accuracy']:.1f}% | {'yes' if record['mean_accuracy'] >= threshold else 'no'} |")


def test_lengths(name: str, every: int) -> list[int]:
    """Every ``every``-th test length of the task."""
    return list(get_task(name).test_lengths)[::every]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", nargs="+", default=["parity_check"], choices=list(TASKS))
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--every", type=int, default=1, help="test every n-th test length")
    parser.add_argument("--threshold", type=float, default=0.95, help="accuracy over the test lengths that counts")
    parser.add_argument("--expect", type=int, default=9, help="least number of seeds per task at the threshold")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per seed")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once (processes)")
    parser.add_argument("--output", help="records JSON (rewritten after every seed)")
    parser.add_argument("--resume", action="store_true", help="keep the seeds --output already holds")
    args = parser.parse_args(argv)
    for flag in ("first_seed", "seeds", "every", "threads", "jobs", "expect"):
        least = 0 if flag in ("first_seed", "expect") else 1
        if getattr(args, flag) < least:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected at least {least}")
    if not 0 < args.threshold <= 1:
        parser.error(f"--threshold {args.threshold}: an accuracy in (0, 1], e.g. 0.95")
    torch.set_num_threads(args.threads)
    settings = RunSettings()
    output = Path(args.output) if args.output else None
    records = json.loads(output.read_text())["results"] if output and args.resume and output.is_file() else []
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
