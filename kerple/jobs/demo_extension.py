"""`make demo-extension`: RoPE context extension fine-tuned beside KERPLE (docs/context-extension.md).

The short long-context fine-tuning of PI and YaRN (Chen et al. 2023 §3, Peng et al. 2023 §4: continue
the trained model at the longer length with the scaling on) next to KERPLE-log, ALiBi and plain rotary
given the same steps at the same length, with the time each took; the table goes to
``results/demo/extension.md``. The zero-shot columns of ``make demo``'s table: :mod:`kerple.jobs.demo`.

    python tools/demo_extension.py [--factor 4] [--steps 200] [--lr 1e-3]   # after (or instead of) make demo
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

from kerple.data.prepared import PreparedData
from kerple.errors import entry_point, future_result, load_modules
from kerple.flags import AT_LEAST_1, POSITIVE, Bounds, check_flags, check_unique, number_list
from kerple.jobs import demo_runs
from kerple.jobs.demo import commands_for
from kerple.jobs.demo_runs import PYTHON, ROOT, evaluate_command, finished

FINETUNED = (  # (run name, pos_emb, rotary scaling method or None)
    ("rotary+linear", "rotary", "linear"),
    ("rotary+yarn", "rotary", "yarn"),
    ("rotary", "rotary", None),
    ("kerple_log", "kerple_log", None),
    ("alibi", "alibi", None),
)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """This script's options; the rest are ``make demo``'s (``--train-length``, ``--runs``, ...)."""
    parser = argparse.ArgumentParser(description="PI, YaRN, KERPLE-log, ALiBi and rotary fine-tuned at a longer length")
    parser.add_argument("--factor", type=int, default=4, help="fine-tune at this many times the train length (2 or more)")
    parser.add_argument("--steps", type=int, default=200, help="fine-tuning steps (the same for every model)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of the fine-tuning")
    parser.add_argument("--eval-factors", default="1,4,8,16,32", help="evaluation lengths in train lengths")
    parser.add_argument("--finetune-runs", default="runs/demo-extension")
    args, demo_argv = parser.parse_known_args(argv)
    check_flags(args, {"--factor": Bounds(least=2), "--steps": AT_LEAST_1, "--lr": POSITIVE})
    args.factors = number_list("--eval-factors", args.eval_factors, AT_LEAST_1)
    check_unique("--eval-factors", args.factors)
    return args, demo_argv


def scaling(method: str | None, args: argparse.Namespace, demo_args: argparse.Namespace) -> list[str]:
    """The scaling override of ``method`` at the fine-tuning's factor (none for a model without one)."""
    return [] if method is None else [demo_runs.scaling_override(method, args.factor, demo_args.train_length)]


def finetune_arguments(name: str, pos_emb: str, method: str | None, args: argparse.Namespace,
                       demo_args: argparse.Namespace, data: PreparedData) -> list[str]:
    """The demo's config for ``pos_emb`` with the fine-tuning settings: load the trained run, weights only,
    ``factor`` times the length at the same tokens per step, ``steps`` steps, and the scaling on."""
    length = demo_args.train_length * args.factor
    save = f"{args.finetune_runs}/{name}"
    changes = {
        "seq_length": length, "max_position_embeddings": length,
        "micro_batch_size": max(1, demo_args.micro_batch // args.factor), "train_iters": args.steps,
        "lr_decay_iters": args.steps, "lr": args.lr, "eval_interval": args.steps, "save_interval": args.steps,
        "load": f"{demo_args.runs}/{pos_emb}", "save": save, "log_dir": f"{save}/logs", "finetune": "true",
    }
    arguments = [word for word in demo_runs.config_args(pos_emb, demo_args, data) if word.split("=")[0] not in changes]
    return arguments + [f"{key}={value}" for key, value in changes.items()] + scaling(method, args, demo_args)


def run_one(name: str, pos_emb: str, method: str | None, args: argparse.Namespace, demo_args: argparse.Namespace,
            data: PreparedData, runner: demo_runs.Runner) -> float:
    """Fine-tune one model (unless finished) and evaluate the fine-tuned weights; returns the fine-tuning's
    wall seconds (recorded beside the run; 0 when a reused run has no record)."""
    from kerple.atomic import write_json_atomic

    arguments = finetune_arguments(name, pos_emb, method, args, demo_args, data)
    run_dir = ROOT / args.finetune_runs / name
    timing = run_dir / "finetune_seconds.json"  # kept beside the run, so a reused run still shows its cost
    resolved = run_dir / f"global_step{args.steps}" / "configs" / "resolved.yml"
    if finished(run_dir, args.steps) and (changes := demo_runs.changed_keys(resolved, arguments)):
        demo_runs.set_aside(run_dir, changes)  # fine-tuned with another --factor, --lr, ...: again
    if not finished(run_dir, args.steps):
        started = time.perf_counter()
        runner.run(f"{name} fine-tune", [[PYTHON, "train.py", *arguments]])
        write_json_atomic(timing, {"seconds": time.perf_counter() - started, "steps": args.steps})
    seconds = json.loads(timing.read_text())["seconds"] if timing.is_file() else 0.0
    output = f"{demo_args.results}/extension/finetuned-{name}.json"
    runner.run(f"{name} eval", [evaluate_command(arguments, output, lengths(args, demo_args), demo_args.num_tokens,
                                                 "--load", str(run_dir), "--attention-impl", "sdpa")])
    return seconds


def lengths(args: argparse.Namespace, demo_args: argparse.Namespace) -> list[int]:
    return [demo_args.train_length * f for f in args.factors]


def before_command(name: str, pos_emb: str, method: str | None, args: argparse.Namespace,
                   demo_args: argparse.Namespace, data: PreparedData) -> list[str]:
    """evaluate.py of a trained model before fine-tuning, at the same lengths (PI and YaRN zero-shot at
    the fine-tuning's factor)."""
    return evaluate_command(demo_runs.config_args(pos_emb, demo_args, data),
                            f"{demo_args.results}/extension/before-{name}.json", lengths(args, demo_args),
                            demo_args.num_tokens, *scaling(method, args, demo_args), "--attention-impl", "sdpa")


def table(args: argparse.Namespace, demo_args: argparse.Namespace, seconds: dict[str, float]) -> str:
    """Markdown: perplexity per length before and after fine-tuning, and the fine-tuning's time."""
    from kerple.evaluation.stats import display_name

    results = ROOT / demo_args.results / "extension"
    header = ("| model | fine-tuning | " + " | ".join(map(str, lengths(args, demo_args))) + " | time |\n"
              "|---|---|" + "---:|" * (len(args.factors) + 1) + "\n")
    rows = []
    for stage in ("before", "finetuned"):
        for name, _, _ in FINETUNED:
            ppl = {r["length"]: r["ppl"] for r in json.loads((results / f"{stage}-{name}.json").read_text())["results"]}
            what = "none" if stage == "before" else f"{args.steps} steps at {demo_args.train_length * args.factor}"
            took = f"{seconds[name]:.0f} s" if stage == "finetuned" and seconds.get(name) else ""
            cells = " | ".join(f"{ppl[length]:.0f}" for length in lengths(args, demo_args))
            rows.append(f"| {display_name(name)} | {what} | {cells} | {took} |")
    return header + "\n".join(rows) + "\n"


def run_all(args: argparse.Namespace, demo_args: argparse.Namespace, data: PreparedData) -> dict[str, Any]:
    """The base models still missing, every model before fine-tuning, then fine-tuned; the seconds each took."""
    bases = sorted({pos_emb for _, pos_emb, _ in FINETUNED})
    demo_runs.set_aside_stale_runs(demo_args, data, bases)  # trained for other steps or with another config: again
    with closing(demo_runs.Runner(total_steps=len(FINETUNED) * args.steps, threads=1)) as runner:
        runner.run_many({name: commands_for(name, demo_args, data) for name in bases
                         if not finished(ROOT / demo_args.runs / name, demo_args.steps)}, demo_args.jobs)
        runner.run_many({f"{name} before": [before_command(name, *how, args, demo_args, data)]
                         for name, *how in FINETUNED}, demo_args.jobs)
        with ThreadPoolExecutor(max_workers=demo_args.jobs) as pool:
            jobs = {name: pool.submit(run_one, name, *how, args, demo_args, data, runner) for name, *how in FINETUNED}
            return {name: future_result(job) for name, job in jobs.items()}


@entry_point("demo_extension.py")
def main(argv: list[str] | None = None) -> int:
    from kerple.atomic import write_text_atomic

    args, demo_argv = parse_args(argv)
    demo_args = demo_runs.parse_args(demo_argv)
    load_modules("demo_extension.py", "kerple.checkpoint.files", "kerple.config")  # before any work: Ctrl-C stops at once
    started = time.perf_counter()
    data = demo_runs.prepare_data(demo_args)
    text = table(args, demo_args, run_all(args, demo_args, data))
    path = ROOT / demo_args.results / "extension.md"
    write_text_atomic(path, text)
    print(f"\nPerplexity before and after {args.steps} fine-tuning steps at {args.factor}x the train length "
          f"({demo_args.micro_batch // args.factor or 1} x {demo_args.train_length * args.factor} tokens per step, "
          f"peak lr {args.lr:g}; one seed; {demo_args.jobs} jobs side by side):\n\n{text}\nwrote {demo_runs.shown_path(path)}")
    print(f"time: {time.perf_counter() - started:.0f} s")
    return 0
