"""Regular-language length generalization (thesis §6.4, Table 6.1): RegularGPT against baselines.

    python tools/regular_languages.py --task parity_check even_pairs --arch regulargpt transformer \
        --chunk-size 2 --seeds 3 --steps 2000 --output results/regular.json

Trains on lengths up to 40 (Deletang et al.'s tasks; 50 for D_n and Tomita) and tests on every
length 41-500 (51-100), or on ``--test-lengths`` (e.g. ``41:501:10``). Writes the JSON
(``results``: one record per task, model and seed; ``summary``: Max/Avg over seeds), the summary
table as ``<output>.md`` and the accuracy-vs-length plot as ``<output>.png``, and prints the table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from kerple import atomic
from kerple.errors import KerpleError, entry_point
from kerple.regular_languages.bench import ARCHS, RunSettings, plot_accuracy, run, summary_rows, summary_table
from kerple.regular_languages.tasks import TASKS, Task, get_task


def parse_lengths(text: str | None, task: Task) -> list[int]:
    """``start:stop[:step]`` (stop exclusive) or a comma list; ``None``: the task's test range."""
    if not text:
        return list(task.test_lengths)
    try:
        if ":" in text:
            return list(range(*(int(part) for part in text.split(":"))))
        return [int(part) for part in text.split(",")]
    except (TypeError, ValueError) as error:
        raise KerpleError(f"--test-lengths {text!r}: expected start:stop[:step] or a comma list ({error})") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", nargs="+", required=True, choices=list(TASKS))
    parser.add_argument("--arch", nargs="+", default=["regulargpt"], choices=list(ARCHS))
    parser.add_argument("--chunk-size", type=int, default=2, help="RegularGPT's C (Eq. 6.1)")
    parser.add_argument("--thickness", type=int, default=1, help="RegularGPT's K (shared blocks)")
    parser.add_argument("--pos-emb", default="rpe", help="the transformer's embedding (kerple.positional registry)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds S..S+N-1 (S: --first-seed)")
    parser.add_argument("--first-seed", type=int, default=0, help="first seed S")
    parser.add_argument("--steps", type=int, default=RunSettings.steps)
    parser.add_argument("--batch-size", type=int, default=RunSettings.batch_size)
    parser.add_argument("--lr", type=float, default=RunSettings.learning_rate)
    parser.add_argument("--hidden-size", type=int, default=RunSettings.hidden_size)
    parser.add_argument("--layers", type=int, default=RunSettings.transformer_layers, help="transformer baseline depth")
    parser.add_argument("--probability", type=float, default=0.5, help="P(b) for parity_check (Table 6.2)")
    parser.add_argument("--eval-samples", type=int, default=RunSettings.eval_samples, help="strings per test length")
    parser.add_argument("--test-lengths", help="start:stop[:step] or a comma list (default: every test length)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--output", required=True, help="results JSON (the table and plot go beside it)")
    parser.add_argument("--progress", action="store_true", help="tqdm bars")
    return parser


@entry_point("regular_languages.py")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = RunSettings(
        hidden_size=args.hidden_size, transformer_layers=args.layers, chunk_size=args.chunk_size,
        thickness=args.thickness, pos_emb=args.pos_emb, steps=args.steps, batch_size=args.batch_size,
        learning_rate=args.lr, eval_samples=args.eval_samples, probability=args.probability,
    )
    output = Path(args.output)
    results: list[dict] = []
    started = time.perf_counter()
    for name in args.task:
        task = get_task(name)
        lengths = parse_lengths(args.test_lengths, task)
        for arch in args.arch:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                record = run(task, arch, seed, settings, lengths, progress=args.progress)
                results.append(record)
                print(
                    f"{name} {arch} seed {seed}: mean accuracy {100 * record['mean_accuracy']:.1f}% on lengths "
                    f"{lengths[0]}-{lengths[-1]}, {100 * record['train_length_accuracy']:.1f}% at length "
                    f"{task.train_max_length} ({record['train_seconds']:.0f}s train, {record['test_seconds']:.0f}s test)",
                    file=sys.stderr, flush=True,
                )
                _write(output, results, time.perf_counter() - started)
    print(summary_table(summary_rows(results)))
    return 0


def _write(output: Path, results: list[dict], seconds: float) -> None:
    """The JSON, the table and the plot of the results so far (atomically; rewritten after each run)."""
    rows = summary_rows(results)
    atomic.write_json_atomic(output, {"results": results, "summary": rows, "wall_seconds": seconds})
    atomic.write_text_atomic(output.with_suffix(".md"), summary_table(rows) + "\n")
    with atomic.atomic_path(output.with_suffix(".png"), suffix=".png") as path:
        plot_accuracy(results, str(path))


if __name__ == "__main__":
    sys.exit(main())
