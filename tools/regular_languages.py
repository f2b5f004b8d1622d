"""Regular-language length generalization (thesis §6.4, Table 6.1): RegularGPT against baselines.

    python tools/regular_languages.py --task parity_check even_pairs --arch regulargpt transformer \
        --chunk-size 2 --seeds 3 --output results/regular.json
    python tools/regular_languages.py --table61 --output results/table61.json [--resume]

Trains on lengths up to 40 (Deletang et al.'s tasks; 50 for D_n and Tomita) and tests on every
length 41-500 (51-100), or on ``--test-lengths`` (e.g. ``41:501:10``). Writes the JSON
(``results``: one record per task, model and seed; ``summary``: Max/Avg over seeds beside the
thesis' numbers), the summary table as ``<output>.md`` and the accuracy-vs-length plot as
``<output>.png``, and prints the table. ``--table61`` runs the table's 12 tasks for RegularGPT
(C = 2) and the transformer baseline (see ``TABLE61`` for its budget); ``--resume`` keeps the
runs an earlier call already wrote to ``--output`` and runs only the missing ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from kerple import atomic
from kerple.errors import KerpleError, UsageError, entry_point, exit_on_interrupt
from kerple.flags import AT_LEAST_0, AT_LEAST_1, POSITIVE, PROBABILITY, Bounds, check_flags, check_not_more, \
    check_unique, given_flags, refuse_unused
from kerple.outputs import check_output_file
from kerple.regular_languages.settings import ARCH_NAMES, PADDINGS, RunSettings, resume_conflict
from kerple.regular_languages.tasks import TASKS, Task, get_task

# --table61: every task of Table 6.1, RegularGPT C = 2 against the transformer, 3 seeds, the default
# budget (each run stops once its training loss is below --stop-loss, or after --steps), 32 strings per length.
TABLE61 = {"task": list(TASKS), "arch": ["regulargpt", "transformer"], "seeds": 3, "eval_samples": 32}


COST = ("The defaults learn Parity Check (RegularGPT, 10 of 10 seeds at >= 95% on lengths 41-500, "
        "benchmarks/regular_seeds.py): Adam at --lr 1e-3 after a --warmup of 1000 steps, at most --steps 8000, "
        "stopping at --stop-loss 0.001. A seed costs about 12 minutes on one core (4.5 training, 7.5 testing "
        "460 lengths x 100 strings; up to 20 when it needs most of the steps): --seeds 3 about 36 minutes. "
        "--eval-samples 32 or --test-lengths 41:501:10 cut the testing.")


FIRST_SEED = 100
"""Seeds from here were fixed before any ran (0-19 served to find the defaults; docs/regular-languages.md)."""


def parse_lengths(text: str | None, task: Task) -> list[int]:
    """``start:stop[:step]`` (stop exclusive) or a comma list; ``None``: the task's test range."""
    if not text:
        return list(task.test_lengths)
    try:
        lengths = (list(range(*(int(part) for part in text.split(":")))) if ":" in text
                   else [int(part) for part in text.split(",")])
    except (TypeError, ValueError) as error:
        raise KerpleError(f"--test-lengths {text!r}: expected start:stop[:step] or a comma list, e.g. 41:501:20 "
                          f"({error})") from None
    if not lengths or min(lengths) < 1:
        raise KerpleError(f"--test-lengths {text!r}: gives {'no length' if not lengths else 'a length below 1'}; "
                          "write start:stop[:step] with 1 <= start < stop (stop exclusive), e.g. 41:501:20")
    if min(lengths) <= task.train_max_length:  # Table 6.1 averages lengths beyond training only
        first, last = task.test_lengths[0], task.test_lengths[-1]
        raise KerpleError(f"--test-lengths {text!r}: {task.name} trains on lengths 1-{task.train_max_length}, so "
                          f"{min(lengths)} is no extrapolation; give lengths above {task.train_max_length}, e.g. "
                          f"{first}:{last + 1}:{max(1, len(task.test_lengths) // 10)} (run tasks with other training "
                          "lengths in their own command)")
    return lengths


FLAG_BOUNDS = {
    "--seeds": AT_LEAST_1, "--first-seed": AT_LEAST_0, "--steps": AT_LEAST_1, "--batch-size": AT_LEAST_1,
    "--lr": POSITIVE, "--hidden-size": AT_LEAST_1, "--layers": AT_LEAST_1, "--eval-samples": AT_LEAST_1,
    "--chunk-size": Bounds(least=2), "--thickness": AT_LEAST_1, "--stop-loss": AT_LEAST_0, "--warmup": AT_LEAST_0,
    "--threads": AT_LEAST_1, "--probability": PROBABILITY,
}
"""Where each numeric flag may lie (every float finite as well)."""
ONLY_FOR = {  # option -> (the task or model it applies to, where it is in args)
    "probability": ("parity_check", "task"), "chunk_size": ("regulargpt", "arch"), "thickness": ("regulargpt", "arch"),
    "padding": ("regulargpt", "arch"), "pos_emb": ("transformer", "arch"), "layers": ("transformer", "arch"),
}


def check_numbers(args: argparse.Namespace, given: set[str]) -> None:
    """Refuse a numeric flag that is not finite or outside its bounds, and a warm-up longer than the
    training, naming the flag."""
    check_flags(args, FLAG_BOUNDS)
    default = "" if "warmup" in given else " (the default)"
    check_not_more("--warmup", args.warmup, "--steps", args.steps,
                   f"the learning rate would never reach --lr; give a --warmup of at most {args.steps}",
                   value_note=default)


def check_combination(args: argparse.Namespace, given: set[str]) -> None:
    """Refuse a task or model named twice, and an option typed for a task or model that is not run."""
    check_unique("--task", args.task)
    check_unique("--arch", args.arch)
    unused = {name: f"applies to {target} only, which this command does not run (--{where} "
                    f"{' '.join(getattr(args, where))})"
              for name, (target, where) in ONLY_FOR.items() if target not in getattr(args, where)}
    refuse_unused(given, unused)


def check_outputs(output: str) -> None:
    """The JSON must end in .json: the table and the plot go beside it as .md and .png."""
    path = Path(output)
    if path.suffix != ".json":
        raise UsageError(f"--output {output}: name a .json file; the table and the plot are written beside it "
                         f"({path.with_suffix('.md').name}, {path.with_suffix('.png').name})")
    for written in (path, path.with_suffix(".md"), path.with_suffix(".png")):
        check_output_file(written, "--output" if written == path else f"--output's {written.suffix[1:]} file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=COST)
    parser.add_argument("--task", nargs="+", choices=list(TASKS))
    parser.add_argument("--table61", action="store_true",
                        help="every task of Table 6.1, regulargpt and transformer, 3 seeds, the CPU budget of TABLE61 "
                             "(flags given explicitly still win)")
    parser.add_argument("--padding", choices=PADDINGS, default=RunSettings.padding,
                        help="RegularGPT's padding (thesis §6.2.1): pad (visible PAD state) or none (keys before "
                             "position 0 left out, the earlier reading)")
    parser.add_argument("--stop-loss", type=float, default=RunSettings.stop_loss,
                        help="stop training once the mean loss of the last 100 steps is below this (0: never)")
    parser.add_argument("--resume", action="store_true", help="keep the runs --output already holds; run the rest")
    parser.add_argument("--arch", nargs="+", default=["regulargpt"], choices=list(ARCH_NAMES))
    parser.add_argument("--chunk-size", type=int, default=2, help="RegularGPT's C (Eq. 6.1)")
    parser.add_argument("--thickness", type=int, default=1, help="RegularGPT's K (shared blocks)")
    parser.add_argument("--pos-emb", default=RunSettings.pos_emb, metavar="POS_EMB",
                        help="the transformer's embedding: a pos_emb of the registry (kerple/positional/), e.g. rpe, "
                             "alibi, kerple_log")
    parser.add_argument("--seeds", type=int, default=3, help="seeds S..S+N-1 (S: --first-seed)")
    parser.add_argument("--first-seed", type=int, default=FIRST_SEED,
                        help="first seed S (default 100: seeds 0-19 served to choose the defaults, so a result from "
                             "them would be chosen after looking)")
    parser.add_argument("--steps", type=int, default=RunSettings.steps, help="most training steps per run")
    parser.add_argument("--batch-size", type=int, default=RunSettings.batch_size)
    parser.add_argument("--lr", type=float, default=RunSettings.learning_rate, help="Adam's learning rate after the warm-up")
    parser.add_argument("--warmup", type=int, default=RunSettings.warmup_steps,
                        help="steps over which the learning rate rises linearly to --lr (0: none)")
    parser.add_argument("--hidden-size", type=int, default=RunSettings.hidden_size)
    parser.add_argument("--layers", type=int, default=RunSettings.transformer_layers, help="transformer baseline depth")
    parser.add_argument("--probability", type=float, default=RunSettings.probability, help="P(b) for parity_check (Table 6.2)")
    parser.add_argument("--eval-samples", type=int, default=RunSettings.eval_samples, help="strings per test length")
    parser.add_argument("--test-lengths", help="start:stop[:step] or a comma list (default: every test length)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--output", required=True, help="results JSON (the table and plot go beside it)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (on by default: a run takes minutes; off a terminal, a line every 10 s)")
    return parser


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """The flags, with ``--table61``'s values for every flag not given explicitly."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = given_flags(parser, argv)
    if args.table61:
        for key, value in TABLE61.items():
            if key not in given:
                setattr(args, key, value)
    if not args.task:
        raise KerpleError("name the tasks with --task (or run the whole table with --table61)")
    check_numbers(args, given)
    check_combination(args, given)
    for name in args.task:
        parse_lengths(args.test_lengths, get_task(name))
    check_outputs(args.output)
    return args


def earlier_results(output: Path, resume: bool) -> list[dict]:
    """The records ``output`` already holds when resuming (none otherwise, or when it does not exist)."""
    if not resume:
        return []
    if not output.is_file():
        print(f"--resume: {output} does not exist yet; every run is made", file=sys.stderr)
        return []
    try:
        return list(json.loads(output.read_text())["results"])
    except (ValueError, KeyError, TypeError) as error:
        raise KerpleError(f"--resume: {output} is not a results file of this tool ({error}); move it away") from None


def check_resumable(results: list[dict], settings: RunSettings, args: argparse.Namespace, output: Path) -> None:
    """Refuse to resume ``output`` when its runs used other settings or test lengths than this call's:
    its records would stand in the table for runs that were never made with these settings."""
    for record in results:
        lengths = parse_lengths(args.test_lengths, get_task(record["task"])) if record["task"] in args.task else None
        conflict = resume_conflict(record, settings, lengths)
        if conflict:
            raise UsageError(f"--resume: {output} holds {conflict}; resume with the same flags, or write to another "
                             "--output")


def run_settings(args: argparse.Namespace) -> RunSettings:
    """The runs' settings from the flags."""
    return RunSettings(
        hidden_size=args.hidden_size, transformer_layers=args.layers, chunk_size=args.chunk_size,
        thickness=args.thickness, padding=args.padding, pos_emb=args.pos_emb, steps=args.steps,
        batch_size=args.batch_size, learning_rate=args.lr, warmup_steps=args.warmup, eval_samples=args.eval_samples,
        probability=args.probability, stop_loss=args.stop_loss,
    )


@entry_point("regular_languages.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    settings = run_settings(args)
    output = Path(args.output)
    results = earlier_results(output, args.resume)
    check_resumable(results, settings, args, output)
    with exit_on_interrupt("regular_languages.py"):  # nothing is written before the first run ends
        import torch

        from kerple import positional
        from kerple.regular_languages import bench
    if args.pos_emb not in (*positional.names(), *positional.aliases()):
        raise UsageError(f"--pos-emb {args.pos_emb}: not an embedding of the registry; choose one of "
                         f"{', '.join(positional.names())}")
    if args.threads:
        torch.set_num_threads(args.threads)
    check_models(args, settings, bench)
    done = {(r["task"], r["arch"], r["seed"]) for r in results}
    planned = {(name, arch, seed) for name in args.task for arch in args.arch
               for seed in range(args.first_seed, args.first_seed + args.seeds)}
    started = time.perf_counter()
    for name in args.task:
        task = get_task(name)
        lengths = parse_lengths(args.test_lengths, task)
        for arch in args.arch:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                if (name, arch, seed) in done:
                    continue
                record = bench.run(task, arch, seed, settings, lengths, progress=not args.no_progress)
                results.append(record)
                print(
                    f"{name} {arch} seed {seed}: mean accuracy {100 * record['mean_accuracy']:.1f}% on lengths "
                    f"{lengths[0]}-{lengths[-1]}, {100 * record['train_length_accuracy']:.1f}% at length "
                    f"{task.train_max_length} ({record['steps']} steps, {record['train_seconds']:.0f}s train, "
                    f"{record['test_seconds']:.0f}s test)",
                    file=sys.stderr, flush=True,
                )
                _write(output, results, planned, time.perf_counter() - started)
    print(bench.summary_table(bench.summary_rows(results)))
    return 0


def check_models(args: argparse.Namespace, settings: RunSettings, bench: Any) -> None:
    """Build every model asked for and run it once at each task's longest length and head width,
    before any training: a setting that cannot run (a width the heads do not divide, an embedding
    that cannot reach the test lengths) is refused now, not after minutes of training."""
    import torch

    heads = settings.num_heads
    if any(arch != "rnn" for arch in args.arch) and settings.hidden_size % heads:
        raise UsageError(f"--hidden-size {settings.hidden_size}: must be a multiple of the {heads} attention heads, "
                         f"e.g. {heads * max(1, round(settings.hidden_size / heads))}")
    for name in args.task:
        task = get_task(name)
        longest = max(parse_lengths(args.test_lengths, task))
        for arch in args.arch:
            try:
                with torch.no_grad():
                    bench.build_classifier(arch, task, settings).eval()(torch.zeros(1, longest, dtype=torch.long))
            except ValueError as error:
                flags = f"--pos-emb {settings.pos_emb} with --hidden-size {settings.hidden_size}" \
                    if arch == "transformer" else f"--arch {arch} with --hidden-size {settings.hidden_size}"
                works = "--pos-emb rpe (the default) runs any length" if arch == "transformer" else \
                    f"--hidden-size {RunSettings.hidden_size} works"
                raise UsageError(f"{flags} cannot run {name} up to length {longest}: {error}; {works}") from None


def _write(output: Path, results: list[dict], planned: set[tuple[str, str, int]], seconds: float) -> None:
    """The JSON, the table and the plot of the results so far (atomically; rewritten after each run).
    Until the last of the ``planned`` runs is in, both say the command has not finished, so a table
    left by a stopped command is not read as the final one."""
    from kerple.regular_languages import bench

    rows = bench.summary_rows(results)
    missing = planned - {(r["task"], r["arch"], r["seed"]) for r in results}
    complete = not missing
    atomic.write_json_atomic(output, {"results": results, "summary": rows, "runs_missing": len(missing),
                                      "complete": complete, "wall_seconds": seconds})
    note = "" if complete else (f"\nIncomplete: {len(missing)} of the {len(planned)} runs asked for are missing; the "
                                "command has not finished "
                                "(rerun it with --resume to add the rest).\n")
    atomic.write_text_atomic(output.with_suffix(".md"), bench.summary_table(rows) + "\n" + note)
    with atomic.atomic_path(output.with_suffix(".png"), suffix=".png") as path:
        bench.plot_accuracy(results, str(path))


if __name__ == "__main__":
    sys.exit(main())
