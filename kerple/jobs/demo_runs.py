"""What ``make demo``, ``make demo-extension`` and ``make analysis-demo`` share: the demo's options,
its prepared data, the config of each run, the runs that can be reused, the one evaluate.py command,
and the runner that trains several models side by side under one progress bar."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kerple.data.prepared import PreparedData
from kerple.errors import future_result, quiet_log
from kerple.flags import AT_LEAST_1, POSITIVE, Bounds, check_flags, name_list
from kerple.jobs.process import REPO as ROOT
from kerple.jobs.process import run_child
from kerple.jobs.progress import MetricsFollower

PYTHON = sys.executable
POS_EMBS = ("kerple_log", "kerple_power", "alibi", "rpe", "rotary", "sinusoidal", "sandwich", "fire", "cable", "xpos")
FACTORS = (1, 2, 4, 8, 16)
MIN_VOCAB = 257
"""The smallest byte-level BPE: 256 bytes and <|endoftext|> (prepare_data.py --train-tokenizer)."""
FLAG_BOUNDS = {"--train-length": Bounds(least=2), "--steps": AT_LEAST_1, "--micro-batch": AT_LEAST_1,
               "--lr": POSITIVE, "--vocab": Bounds(least=MIN_VOCAB), "--num-tokens": AT_LEAST_1, "--jobs": AT_LEAST_1}
RUN_PLACES = {"save", "load", "log_dir", "tensorboard_dir"}  # where a run writes, not what it trains
SHOWN = ("step ", "L=", "validation", "training finished", "wrote")  # the children's lines the demos echo


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The demo's options (the other two demos pass on the ones they do not take)."""
    parser = argparse.ArgumentParser(description="`make demo`: the KERPLE paper's extrapolation story in minutes on a CPU, "
                                                 "with embedded data.")
    parser.add_argument("--pos-emb", default=",".join(POS_EMBS))
    parser.add_argument("--train-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400, help="training steps per model")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3,
                        help="peak learning rate (tiny.yml's 1e-3 leaves these 400-step models far less trained)")
    parser.add_argument("--vocab", type=int, default=4096, help="size of the BPE trained on the corpus")
    parser.add_argument("--num-tokens", type=int, default=16384, help="scored tokens per length")
    parser.add_argument("--jobs", type=int, default=2, help="trainings run side by side (1 thread each)")
    parser.add_argument("--data-dir", help="default: data/demo-bpe<vocab>")
    parser.add_argument("--runs", default="runs/demo")
    parser.add_argument("--results", default="results/demo")
    args = parser.parse_args(argv)
    check_flags(args, FLAG_BOUNDS)
    known = sorted(path.stem for path in (ROOT / "configs" / "pe").glob("*.yml"))
    args.names = name_list("--pos-emb", args.pos_emb, known)
    args.data_dir = args.data_dir or f"data/demo-bpe{args.vocab}"
    return args


def info_file(args: argparse.Namespace) -> Path:
    return ROOT / args.data_dir / "stdlib" / "stdlib_text_document.info.json"


def read_data(args: argparse.Namespace) -> PreparedData:
    """The prepared corpus of ``--data-dir``, from its ``.info.json``."""
    return PreparedData.from_info(info_file(args), prefix=str(info_file(args).parent / "stdlib_text_document"))


def prepare_data(args: argparse.Namespace) -> PreparedData:
    """``prepare_data.py stdlib`` with a BPE trained on the corpus (skipped when already prepared)."""
    command = [PYTHON, "prepare_data.py", "stdlib", "-d", args.data_dir, "--train-tokenizer", str(args.vocab),
               "--workers", "2"]
    print("$ " + " ".join(command[1:]), flush=True)
    run_child(command, session=False).check("prepare_data.py")
    return read_data(args)


def config_args(pos_emb: str, args: argparse.Namespace, data: PreparedData) -> list[str]:
    """YAML files and overrides shared by train.py and evaluate.py for one embedding."""
    save = f"{args.runs}/{pos_emb}"
    return [
        "configs/models/tiny.yml", f"configs/pe/{pos_emb}.yml", "configs/setups/cpu.yml",
        *(f"{key}={value}" for key, value in data.config_overrides().items()),
        f"seq_length={args.train_length}", f"max_position_embeddings={args.train_length}",
        f"train_iters={args.steps}", f"lr_decay_iters={args.steps}", f"micro_batch_size={args.micro_batch}",
        f"lr={args.lr}",
        f"eval_interval={args.steps}", "eval_iters=4", f"save_interval={args.steps}", "log_interval=50",
        f"save={save}", f"load={save}", f"log_dir={save}/logs", "tensorboard_dir=",
    ]


def evaluate_command(config: list[str], output: Path | str, lengths: Iterable[int], num_tokens: int,
                     *extra: str) -> list[str]:
    """``evaluate.py`` of the run ``config`` (YAML files and overrides) at ``lengths``, non-overlapping
    windows scoring ``num_tokens`` at each (KERPLE §5.2), into ``output``; ``extra``: more arguments."""
    return [PYTHON, "evaluate.py", *config, *extra, "--eval-lengths", ",".join(map(str, lengths)),
            "--protocol", "nonoverlap", "--num-tokens", str(num_tokens), "--no-progress", "--output", str(output)]


def scaling_override(method: str, factor: float, train_length: int) -> str:
    """The ``key=value`` of the run-time option (:func:`kerple.positional.runtime_option_names`) that the
    rotary family takes, set to ``method`` (a ``rope_type`` of Hugging Face's rotary scaling) at
    ``factor``. Dynamic NTK takes factor 1: the base ``b·(f·l/L − (f − 1))^(d/(d−2))`` is then the YaRN
    paper's "Dynamic NTK" (§3) with s = l/L exactly."""
    from kerple.positional import family, runtime_option_names

    declared = {field.name for field in dataclasses.fields(family("rotary").options_class)}
    option = next(name for name in runtime_option_names() if name in declared)
    value: dict[str, Any] = {"rope_type": method, "factor": 1.0 if method == "dynamic" else float(factor)}
    if method == "yarn":
        value["original_max_position_embeddings"] = train_length
    return f"{option}={json.dumps(value)}"


def shown_path(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (``--results`` may point anywhere)."""
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def finished(run_dir: Path, steps: int) -> bool:
    from kerple.checkpoint.files import latest_tag, tag_for  # kerple.checkpoint loads torch: only here

    return latest_tag(run_dir) == tag_for(steps)


def config_changes(pos_emb: str, args: argparse.Namespace, data: PreparedData) -> list[str]:
    """The keys whose value in a finished run's ``configs/resolved.yml`` differs from what this demo
    would train now (``key: old -> new``); empty when the run can be reused."""
    resolved = ROOT / args.runs / pos_emb / f"global_step{args.steps}" / "configs" / "resolved.yml"
    return changed_keys(resolved, config_args(pos_emb, args, data))


def changed_keys(resolved: Path, words: list[str]) -> list[str]:
    """The keys whose value in ``resolved`` (a checkpoint's ``configs/resolved.yml``) differs from the
    config the command words ``words`` give (``key: old -> new``), where the run writes aside."""
    from kerple.config import load_config, parse_overrides, split_arguments

    if not resolved.is_file():
        return [f"{resolved} is missing"]
    yamls, overrides = split_arguments(words)
    with quiet_log():  # the demo's own overrides, not news to the user
        now = load_config([ROOT / path for path in yamls], parse_overrides(overrides)).resolve_batch(1).to_dict()
        before = load_config([resolved]).to_dict()
    before, now = flat(before), flat(now)
    return [f"{key}: {before.get(key)!r} -> {now.get(key)!r}" for key in sorted(set(now) | set(before))
            if key not in RUN_PLACES and before.get(key) != now.get(key)]


def flat(settings: dict, prefix: str = "") -> dict:
    """``{"optimizer": {"params": {"lr": 1}}}`` as ``{"optimizer.params.lr": 1}``."""
    out: dict = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def set_aside_stale_runs(args: argparse.Namespace, data: PreparedData, names: list[str]) -> None:
    """A run in ``--runs`` that cannot be reused or resumed as it is (trained for another number of
    steps, or with another config: an older demo, edited YAMLs) is renamed ``<name>.stale-<time>``
    (nothing is deleted) and trained again, with a line saying why."""
    from kerple.checkpoint.files import latest_tag, tag_for

    for name in names:
        run_dir = ROOT / args.runs / name
        tag = latest_tag(run_dir) if run_dir.is_dir() else None
        if tag is None:
            continue
        if tag != tag_for(args.steps):
            changes = [f"its checkpoint is {tag}, not global_step{args.steps} of --steps {args.steps}"]
        else:
            changes = config_changes(name, args, data)
        if changes:
            set_aside(run_dir, changes)


def set_aside(run_dir: Path, changes: list[str]) -> None:
    """Rename ``run_dir`` to ``<name>.stale-<time>`` beside it, saying why (``changes``)."""
    aside = run_dir.with_name(f"{run_dir.name}.stale-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(aside)
    more = f" (and {len(changes) - 3} more)" if len(changes) > 3 else ""
    print(f"{run_dir} was trained with another config ({'; '.join(changes[:3])}{more}): "
          f"moved to {aside.name} beside it, training it again", flush=True)


def metrics_file(command: list[str]) -> Path | None:
    """The ``metrics.jsonl`` a ``train.py`` command writes (its ``log_dir``); ``None`` for other commands."""
    if Path(command[1]).name != "train.py":
        return None
    log_dir = [word.split("=", 1)[1] for word in command if word.startswith("log_dir=")]
    return ROOT / log_dir[-1] / "metrics.jsonl" if log_dir else None


class Runner:
    """Runs each model's commands in order, several models side by side, one progress bar fed by the
    trainings' ``metrics.jsonl``."""

    def __init__(self, total_steps: int, threads: int) -> None:
        from kerple.progress import progress_bar

        self.bar = progress_bar(total=total_steps, desc="training (all models)", unit="step", dynamic_ncols=True)
        self.lock = threading.Lock()
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}

    def run(self, name: str, commands: list[list[str]]) -> None:
        """Each command in turn; a failed one raises (its last line in the message), Ctrl-C interrupts."""
        for command in commands:
            path, done = metrics_file(command), [0]
            follower = MetricsFollower(path) if path else None

            def show(line: str) -> None:
                if line.lstrip().startswith(SHOWN):
                    with self.lock:
                        self.bar.write(f"[{name}] {line}")

            def advance() -> None:
                step = follower.poll() and follower.step
                if step:
                    with self.lock:
                        self.bar.update(step - done[0])
                    done[0] = step

            outcome = run_child(command, on_line=show, on_tick=advance if follower else None, session=False,
                                env=self.env)
            outcome.check(f"[{name}] {Path(command[1]).name}")

    def run_many(self, jobs: dict[str, list[list[str]]], workers: int) -> None:
        """Each model's commands (``name -> commands``), ``workers`` models side by side."""
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for future in [pool.submit(self.run, name, commands) for name, commands in jobs.items()]:
                future_result(future)

    def close(self) -> None:
        self.bar.close()
