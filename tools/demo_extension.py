"""RoPE context extension beside KERPLE in the demo (docs/context-extension.md).

Two parts:

* zero-shot columns of ``make demo``'s table: the trained rotary model evaluated, without any
  training, with Position Interpolation and YaRN at factor s = L'/L for each length L' (the factor
  a user sets for a target length) and with dynamic NTK (one run: it rescales by the length
  itself); :func:`zero_shot_commands` and :func:`merge_zero_shot`, called by ``tools/demo.py``;
* ``make demo-extension`` (this file as a script): the short long-context fine-tuning of PI and
  YaRN (Chen et al. 2023 §3, Peng et al. 2023 §4: continue the trained model at the longer
  length with the scaling on) next to KERPLE-log, ALiBi and plain rotary given the same steps at
  the same length, with the time each took; the table goes to ``results/demo/extension.md``.

    python tools/demo_extension.py [--factor 4] [--steps 200] [--lr 1e-3]   # after (or instead of) make demo
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kerple.errors import entry_point, future_result, load_modules  # noqa: E402
from kerple.flags import AT_LEAST_1, POSITIVE, Bounds, check_flags, check_unique, number_list  # noqa: E402

ZERO_SHOT_TYPES = ("linear", "dynamic", "yarn")  # PI, dynamic NTK, YaRN
PER_LENGTH_FACTOR = ("linear", "yarn")  # factor = L'/L; dynamic rescales by the length itself
FINETUNED = (  # (run name, pos_emb, rope_type or None)
    ("rotary+linear", "rotary", "linear"),
    ("rotary+yarn", "rotary", "yarn"),
    ("rotary", "rotary", None),
    ("kerple_log", "kerple_log", None),
    ("alibi", "alibi", None),
)


def rope_scaling(rope_type: str, factor: float, train_length: int) -> dict[str, Any]:
    """The ``rope_scaling`` of one method for a model trained at ``train_length``.

    Dynamic NTK takes ``factor`` 1: ``transformers``' base ``b·(f·l/L − (f − 1))^(d/(d−2))`` is
    then the YaRN paper's "Dynamic NTK" (§3) with s = l/L exactly.
    """
    if rope_type == "dynamic":
        return {"rope_type": "dynamic", "factor": 1.0}
    if rope_type == "yarn":
        return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": train_length}
    return {"rope_type": rope_type, "factor": float(factor)}


def override(value: dict[str, Any]) -> str:
    """``rope_scaling={...}`` as one command-line ``key=value`` (a YAML flow mapping)."""
    return "rope_scaling=" + json.dumps(value)


def zero_shot_commands(evaluate: list[str], results: Path, train_length: int, factors: tuple[int, ...]) -> list[list[str]]:
    """evaluate.py runs of the trained rotary model with each zero-shot method (``evaluate``: the demo's
    rotary evaluation command without ``--eval-lengths`` and ``--output``), written to ``results/extension/``."""
    commands = []
    for rope_type in ZERO_SHOT_TYPES:
        if rope_type in PER_LENGTH_FACTOR:
            for factor in factors[1:]:
                output = results / "extension" / f"rotary+{rope_type}@{factor}.json"
                commands.append([*evaluate, override(rope_scaling(rope_type, factor, train_length)),
                                 "--eval-lengths", str(train_length * factor), "--output", str(output)])
        else:
            lengths = ",".join(str(train_length * factor) for factor in factors)
            output = results / "extension" / f"rotary+{rope_type}.json"
            commands.append([*evaluate, override(rope_scaling(rope_type, 1, train_length)),
                             "--eval-lengths", lengths, "--output", str(output)])
    return commands


def merge_zero_shot(results: Path, factors: tuple[int, ...]) -> list[Path]:
    """One results file per method, ``results/rotary+<rope_type>.json``: the per-length runs' rows, and at
    1x rotary's own row (factor 1 is no scaling for PI and YaRN)."""
    written = []
    for rope_type in ZERO_SHOT_TYPES:
        if rope_type not in PER_LENGTH_FACTOR:
            source = results / "extension" / f"rotary+{rope_type}.json"
            written.append(_write(results / f"rotary+{rope_type}.json", json.loads(source.read_text())))
            continue
        documents = [json.loads((results / "extension" / f"rotary+{rope_type}@{f}.json").read_text()) for f in factors[1:]]
        merged = dict(documents[0])
        plain = json.loads((results / "rotary.json").read_text())["results"][0]
        merged["results"] = [plain] + [row for document in documents for row in document["results"]]
        merged["run"] = {**merged["run"], "rope_scaling_factor_per_length": {
            str(row["length"]): row["length"] // plain["length"] for row in merged["results"]}}
        written.append(_write(results / f"rotary+{rope_type}.json", merged))
    return written


def _write(path: Path, document: dict[str, Any]) -> Path:
    from kerple.atomic import write_json_atomic

    write_json_atomic(path, document)
    return path


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """This script's options; the rest are ``tools/demo.py``'s (``--train-length``, ``--runs``, ...)."""
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


def finetune_arguments(name: str, pos_emb: str, rope_type: str | None, args: argparse.Namespace,
                       demo_args: argparse.Namespace, data: Any) -> list[str]:
    """The demo's config for ``pos_emb`` with the fine-tuning settings: load the trained run, weights only,
    ``factor`` times the length at the same tokens per step, ``steps`` steps, and the scaling on."""
    import demo

    length = demo_args.train_length * args.factor
    save = f"{args.finetune_runs}/{name}"
    changes = {
        "seq_length": length, "max_position_embeddings": length,
        "micro_batch_size": max(1, demo_args.micro_batch // args.factor), "train_iters": args.steps,
        "lr_decay_iters": args.steps, "lr": args.lr, "eval_interval": args.steps, "save_interval": args.steps,
        "load": f"{demo_args.runs}/{pos_emb}", "save": save, "log_dir": f"{save}/logs", "finetune": "true",
    }
    arguments = [word for word in demo.config_args(pos_emb, demo_args, data) if word.split("=")[0] not in changes]
    arguments += [f"{key}={value}" for key, value in changes.items()]
    if rope_type is not None:
        arguments.append(override(rope_scaling(rope_type, args.factor, demo_args.train_length)))
    return arguments


def run_one(name: str, pos_emb: str, rope_type: str | None, args: argparse.Namespace, demo_args: argparse.Namespace,
            data: Any, runner: Any) -> float:
    """Fine-tune one model (unless finished) and evaluate the fine-tuned weights; returns the fine-tuning's
    wall seconds (recorded beside the run; 0 when a reused run has no record)."""
    import demo

    arguments = finetune_arguments(name, pos_emb, rope_type, args, demo_args, data)
    lengths = ",".join(str(demo_args.train_length * f) for f in args.factors)
    run_dir = ROOT / args.finetune_runs / name
    timing = run_dir / "finetune_seconds.json"  # kept beside the run, so a reused run still shows its cost
    if demo.finished(run_dir, args.steps):
        changes = demo.changed_keys(run_dir / f"global_step{args.steps}" / "configs" / "resolved.yml", arguments)
        if changes:  # fine-tuned with another --factor, --lr, ...: again
            demo.set_aside(run_dir, changes)
    if not demo.finished(run_dir, args.steps):
        started = time.perf_counter()
        runner.run(f"{name} fine-tune", [[demo.PYTHON, "train.py", *arguments]])
        _write(timing, {"seconds": time.perf_counter() - started, "steps": args.steps})
    seconds = json.loads(timing.read_text())["seconds"] if timing.is_file() else 0.0
    evaluate = [demo.PYTHON, "evaluate.py", *arguments, "--load", str(run_dir), "--eval-lengths", lengths,
                "--protocol", "nonoverlap",
                "--num-tokens", str(demo_args.num_tokens), "--attention-impl", "sdpa", "--no-progress",
                "--output", f"{demo_args.results}/extension/finetuned-{name}.json"]
    runner.run(f"{name} eval", [evaluate])
    return seconds


def before_command(name: str, pos_emb: str, rope_type: str | None, args: argparse.Namespace,
                   demo_args: argparse.Namespace, data: Any) -> list[str]:
    """evaluate.py of a trained model before fine-tuning, at the same lengths (PI and YaRN zero-shot at
    the fine-tuning's factor)."""
    import demo

    lengths = ",".join(str(demo_args.train_length * f) for f in args.factors)
    extra = [] if rope_type is None else [override(rope_scaling(rope_type, args.factor, demo_args.train_length))]
    return [demo.PYTHON, "evaluate.py", *demo.config_args(pos_emb, demo_args, data), *extra, "--eval-lengths", lengths,
            "--protocol", "nonoverlap", "--attention-impl", "sdpa", "--num-tokens", str(demo_args.num_tokens),
            "--no-progress", "--output", f"{demo_args.results}/extension/before-{name}.json"]


def table(args: argparse.Namespace, demo_args: argparse.Namespace, seconds: dict[str, float]) -> str:
    """Markdown: perplexity per length before and after fine-tuning, and the fine-tuning's time."""
    from kerple.evaluation.stats import display_name

    results = ROOT / demo_args.results / "extension"
    lengths = [demo_args.train_length * f for f in args.factors]
    header = ("| model | fine-tuning | " + " | ".join(str(length) for length in lengths) + " | time |\n"
              "|---|---|" + "---:|" * (len(lengths) + 1) + "\n")
    rows = []
    for stage in ("before", "finetuned"):
        for name, _, rope_type in FINETUNED:
            ppl = {r["length"]: r["ppl"] for r in json.loads((results / f"{stage}-{name}.json").read_text())["results"]}
            what = "none" if stage == "before" else f"{args.steps} steps at {demo_args.train_length * args.factor}"
            took = f"{seconds[name]:.0f} s" if stage == "finetuned" and seconds.get(name) else ""
            cells = " | ".join(f"{ppl[length]:.0f}" for length in lengths)
            rows.append(f"| {display_name(name)} | {what} | {cells} | {took} |")
    return header + "\n".join(rows) + "\n"


@entry_point("demo_extension.py")
def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "tools"))
    import demo

    args, demo_argv = parse_args(argv)
    demo_args = demo.parse_args(demo_argv)
    load_modules("demo_extension.py", "kerple.checkpoint.files", "kerple.config")  # before any work: Ctrl-C stops at once
    started = time.perf_counter()
    data = demo.prepare_data(demo_args)
    bases = sorted({pos_emb for _, pos_emb, _ in FINETUNED})
    demo.set_aside_stale_runs(demo_args, data, bases)  # trained for other steps or with another config: again
    runner = demo.Runner(total_steps=len(FINETUNED) * args.steps, threads=1)
    seconds: dict[str, float] = {}
    try:
        with ThreadPoolExecutor(max_workers=demo_args.jobs) as pool:
            for future in [pool.submit(runner.run, name, demo.commands_for(name, demo_args, data)) for name in bases
                           if not demo.finished(ROOT / demo_args.runs / name, demo_args.steps)]:
                future_result(future)
            before = [pool.submit(runner.run, f"{name} before", [before_command(name, pos_emb, rope_type, args, demo_args, data)])
                      for name, pos_emb, rope_type in FINETUNED]
            for future in before:
                future_result(future)
            jobs = {name: pool.submit(run_one, name, pos_emb, rope_type, args, demo_args, data, runner)
                    for name, pos_emb, rope_type in FINETUNED}
            seconds = {name: future_result(job) for name, job in jobs.items()}
    finally:
        runner.close()
    text = table(args, demo_args, seconds)
    path = ROOT / demo_args.results / "extension.md"
    from kerple.atomic import write_text_atomic

    write_text_atomic(path, text)
    print(f"\nPerplexity before and after {args.steps} fine-tuning steps at {args.factor}x the train length "
          f"({demo_args.micro_batch // args.factor or 1} x {demo_args.train_length * args.factor} tokens per step, "
          f"peak lr {args.lr:g}; one seed; {demo_args.jobs} jobs side by side):\n\n{text}\nwrote {path.relative_to(ROOT)}")
    print(f"time: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
