"""`make demo`: the KERPLE paper's extrapolation story in minutes on a CPU, with embedded data.

1. prepares the Python standard library as a corpus (``prepare_data.py stdlib``) with a byte-level
   BPE trained on it (why not the 20B tokenizer is measured and printed);
2. trains a tiny model (2 layers, width 128, train length 64) for each positional embedding with
   ``train.py``: KERPLE's paper's set, Sandwich, and three that came after KERPLE (FIRE, CABLE, xPos);
3. evaluates each with ``evaluate.py`` at 1x, 2x, 4x, 8x and 16x the train length (non-overlapping
   windows, the same scored tokens at every length; KERPLE §5.2), plus KERPLE-log with attention
   windowed to the train length (§5.5), and the rotary model zero-shot with Position Interpolation,
   dynamic NTK and YaRN (``rope_scaling``; ``tools/demo_extension.py``, which also fine-tunes them);
4. prints the Table-3-style table and checks the paper's qualitative result; writes the figures
   (perplexity vs length, position-wise perplexity, learned kernels, effective lengths).

Outputs: ``runs/demo/<pos_emb>/`` (checkpoints, logs), ``results/demo/`` (results JSON, table, PNGs).
A second run reuses the prepared data and finished checkpoints.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))  # demo_extension, also when this file is imported

from kerple.errors import KerpleError, UsageError, entry_point, future_result, load_modules  # noqa: E402
from kerple.flags import AT_LEAST_1, POSITIVE, Bounds, check_flags, check_unique  # noqa: E402
from demo_extension import merge_zero_shot, zero_shot_commands  # noqa: E402

PYTHON = sys.executable
POS_EMBS = ("kerple_log", "kerple_power", "alibi", "rpe", "rotary", "sinusoidal", "sandwich", "fire", "cable", "xpos")
KERNEL_EMBS = ("kerple_log", "kerple_power", "alibi", "rpe", "sandwich")
FACTORS = (1, 2, 4, 8, 16)
STEP_LINE = re.compile(r"step\s+(\d+)/(\d+)")
MIN_VOCAB = 257
"""The smallest byte-level BPE: 256 bytes and <|endoftext|> (prepare_data.py --train-tokenizer)."""
FLAG_BOUNDS = {"--train-length": Bounds(least=2), "--steps": AT_LEAST_1, "--micro-batch": AT_LEAST_1,
               "--lr": POSITIVE, "--vocab": Bounds(least=MIN_VOCAB), "--num-tokens": AT_LEAST_1, "--jobs": AT_LEAST_1}


class StepFailed(KerpleError):
    """A command the demo runs (prepare_data.py, train.py, evaluate.py) failed; the message ends with
    its own last line."""


@dataclass(frozen=True)
class DemoData:
    prefix: str
    split: str
    tokenizer_file: str
    vocab_size: int
    valid_tokens: int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args.names = pos_emb_names(args.pos_emb)
    args.data_dir = args.data_dir or f"data/demo-bpe{args.vocab}"
    return args


def pos_emb_names(text: str) -> list[str]:
    """``--pos-emb``'s comma-separated names, each a ``configs/pe/<name>.yml``, each once."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = sorted(path.stem for path in (ROOT / "configs" / "pe").glob("*.yml"))
    if not names:
        raise UsageError(f"--pos-emb {text!r}: name at least one embedding, e.g. kerple_log,alibi")
    for name in names:
        if name not in known:
            raise UsageError(f"--pos-emb: no configs/pe/{name}.yml; choose among {', '.join(known)}")
    check_unique("--pos-emb", names)
    return names


def output_layer_seconds(vocab: int, tokens: int = 1024, hidden: int = 128, repeats: int = 2) -> float:
    """Forward + backward seconds of the ``[vocab, hidden]`` output layer and its loss on ``tokens``."""
    import torch

    weight = torch.randn(vocab, hidden, requires_grad=True)
    hidden_states = torch.randn(tokens, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    timings = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        torch.nn.functional.cross_entropy(hidden_states @ weight.T, labels).backward()
        timings.append(time.perf_counter() - started)
    return min(timings[1:])


def explain_tokenizer(args: argparse.Namespace, models: int) -> None:
    """Measure why the demo trains its own BPE instead of using the 20B tokenizer; print it."""
    big, small = output_layer_seconds(50304), output_layer_seconds(args.vocab)
    tokens = args.micro_batch * args.train_length
    extra_minutes = (big - small) * args.steps * models / 60
    print(
        f"tokenizer: byte-level BPE with {args.vocab} tokens trained on the corpus, not the 20B tokenizer: "
        f"its 50,304-row output layer takes {big * 1e3:.0f} ms per {tokens}-token step here "
        f"(forward + backward) against {small * 1e3:.0f} ms with {args.vocab} rows, which would add "
        f"~{extra_minutes:.0f} min to the {models} x {args.steps} training steps of the 15-minute budget."
    )


def prepare_data(args: argparse.Namespace) -> DemoData:
    """``prepare_data.py stdlib`` with a BPE trained on the corpus (skipped when already prepared)."""
    command = [PYTHON, "prepare_data.py", "stdlib", "-d", args.data_dir, "--train-tokenizer", str(args.vocab),
               "--workers", "2"]
    print("$ " + " ".join(command[1:]), flush=True)
    done = subprocess.run(command, cwd=ROOT)
    if done.returncode == 130:
        raise KeyboardInterrupt
    if done.returncode != 0:
        raise StepFailed(f"prepare_data.py exited with status {done.returncode} (its message is above)")
    prefix = ROOT / args.data_dir / "stdlib" / "stdlib_text_document"
    info = json.loads(Path(f"{prefix}.info.json").read_text())
    from tokenizers import Tokenizer

    vocab_file = info["tokenizer"]["vocab_file"]
    return DemoData(
        prefix=str(prefix),
        split=info["split"],
        tokenizer_file=vocab_file,
        vocab_size=Tokenizer.from_file(vocab_file).get_vocab_size(),
        valid_tokens=int(info["parts"]["valid"]["tokens"]),
    )


def config_args(pos_emb: str, args: argparse.Namespace, data: DemoData) -> list[str]:
    """YAML files and overrides shared by train.py and evaluate.py for one embedding."""
    save = f"{args.runs}/{pos_emb}"
    return [
        "configs/models/tiny.yml", f"configs/pe/{pos_emb}.yml", "configs/setups/cpu.yml",
        f"data_path={data.prefix}", f"split={data.split}", "tokenizer_type=HFTokenizer",
        f"vocab_file={data.tokenizer_file}", f"vocab_size={data.vocab_size}",
        f"seq_length={args.train_length}", f"max_position_embeddings={args.train_length}",
        f"train_iters={args.steps}", f"lr_decay_iters={args.steps}", f"micro_batch_size={args.micro_batch}",
        f"lr={args.lr}",
        f"eval_interval={args.steps}", "eval_iters=4", f"save_interval={args.steps}", "log_interval=50",
        f"save={save}", f"load={save}", f"log_dir={save}/logs", "tensorboard_dir=",
    ]


def finished(run_dir: Path, steps: int) -> bool:
    from kerple.checkpoint.files import latest_tag, tag_for  # kerple.checkpoint loads torch: only here

    return latest_tag(run_dir) == tag_for(steps)


RUN_PLACES = {"save", "load", "log_dir", "tensorboard_dir"}  # where a run writes, not what it trains


def config_changes(pos_emb: str, args: argparse.Namespace, data: DemoData) -> list[str]:
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
    quiet = logging.getLogger("kerple.config")
    level, quiet.level = quiet.level, logging.WARNING  # the demo's own overrides, not news to the user
    try:
        now = load_config([ROOT / path for path in yamls], parse_overrides(overrides)).resolve_batch(1).to_dict()
        before = load_config([resolved]).to_dict()
    finally:
        quiet.setLevel(level)
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


def set_aside_stale_runs(args: argparse.Namespace, data: DemoData, names: list[str]) -> None:
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


def commands_for(pos_emb: str, args: argparse.Namespace, data: DemoData) -> list[list[str]]:
    """train.py (unless finished) then evaluate.py; KERPLE-log also evaluated windowed (§5.5)."""
    common = config_args(pos_emb, args, data)
    lengths = ",".join(str(args.train_length * f) for f in FACTORS)
    evaluate = [PYTHON, "evaluate.py", *common, "--eval-lengths", lengths, "--protocol", "nonoverlap",
                "--num-tokens", str(args.num_tokens), "--per-position", "--no-progress"]
    commands = []
    if not finished(ROOT / args.runs / pos_emb, args.steps):
        commands.append([PYTHON, "train.py", *common])
    commands.append([*evaluate, "--output", f"{args.results}/{pos_emb}.json"])
    if pos_emb == "kerple_log":
        commands.append([*evaluate, "--attention-window", str(args.train_length),
                         "--output", f"{args.results}/{pos_emb}-windowed.json"])
    if pos_emb == "rotary":  # the same model with PI, dynamic NTK and YaRN, evaluation only
        plain = [PYTHON, "evaluate.py", *common, "--protocol", "nonoverlap", "--num-tokens", str(args.num_tokens),
                 "--no-progress"]
        commands += zero_shot_commands(plain, ROOT / args.results, args.train_length, FACTORS)
    return commands


def failure(name: str, command: list[str], status: int, output: list[str]) -> str:
    """What a failed command said: its last line (a one-line refusal says it all); the lines before it
    are printed too when that line is not a refusal (a crash's traceback)."""
    lines = [line for line in output if line.strip()]
    last = lines[-1].strip() if lines else "(no output)"
    if ": error: " not in last and lines:
        print("\n".join(lines[-30:]), file=sys.stderr)
    script = Path(command[1]).name
    return f"[{name}] {script} exited with status {status}: {last}"


class Runner:
    """Runs each embedding's commands in order, several embeddings side by side, one progress bar."""

    def __init__(self, total_steps: int, threads: int) -> None:
        from kerple.progress import progress_bar

        self.bar = progress_bar(total=total_steps, desc="training (all models)", unit="step", dynamic_ncols=True)
        self.lock = threading.Lock()
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}

    def run(self, name: str, commands: list[list[str]]) -> None:
        for command in commands:
            process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, bufsize=1)
            done = 0
            tail: list[str] = []
            for line in process.stdout:
                line = line.rstrip()
                tail = (tail + [line])[-30:]
                match = STEP_LINE.search(line)
                with self.lock:
                    if match:
                        self.bar.update(int(match.group(1)) - done)
                        done = int(match.group(1))
                    if match or line.startswith(("L=", "validation", "training finished", "wrote")):
                        self.bar.write(f"[{name}] {line}")
            if process.wait() in (130, -2):  # stopped by the Ctrl-C that also reaches this process
                raise KeyboardInterrupt
            if process.returncode != 0:
                raise StepFailed(failure(name, command, process.returncode, tail))

    def close(self) -> None:
        self.bar.close()


def figures(args: argparse.Namespace, data: DemoData, names: list[str]) -> list[Path]:
    """Position-wise perplexity at 16x, learned kernels and effective lengths (§5.4, §5.5, A.5)."""
    from kerple.evaluation import plots
    from kerple.evaluation.stats import display_name
    from kerple.runs import load_run, run_config

    results = ROOT / args.results
    longest = args.train_length * FACTORS[-1]
    curves = {}  # paper Fig. 5: KERPLE-log against its windowed self, T5 and ALiBi (and rotary, FIRE, CABLE here)
    for stem in ["kerple_log", "kerple_log-windowed", "alibi", "rpe", "rotary", "fire", "cable"]:
        path = results / f"{stem}.json"
        if stem.split("-")[0] in names and path.is_file():
            rows = {r["length"]: r for r in json.loads(path.read_text())["results"]}
            label = display_name(stem.replace("-windowed", f"-windowed@{args.train_length}"))
            curves[label] = rows[longest]["per_position_loss"]
    written = [plots.plot_position_wise(curves, results / "position_wise.png", smooth=32, train_length=args.train_length,
                                        title=f"Position-wise perplexity at length {longest} (stdlib)")]
    effective = {}
    for name in [n for n in KERNEL_EMBS if n in names]:
        arguments = [str(ROOT / word) if word.endswith(".yml") else word for word in config_args(name, args, data)]
        run = load_run(run_config(arguments, quiet=True).cfg, str(ROOT / args.runs / name), quiet=True)
        model, iteration = run.model, run.iteration
        table = plots.bias_table(model.positional)
        written.append(plots.plot_kernels(table, results / f"kernels_{name}.png",
                                          title=f"{display_name(name)} kernels after {iteration} steps"))
        if name != "rpe":  # T5's bucketed bias is not a decreasing kernel: no effective length
            effective[display_name(name)] = plots.effective_lengths(table)
    written.append(plots.plot_effective_lengths(effective, results / "effective_lengths.png"))
    return written


def qualitative_check(args: argparse.Namespace, names: list[str]) -> bool:
    """The paper's story: KERPLE-log flat or better with length; sinusoidal and rotary degrade."""
    ppl = {}
    for name in names:
        path = ROOT / args.results / f"{name}.json"
        ppl[name] = {r["length"] // args.train_length: r["ppl"] for r in json.loads(path.read_text())["results"]}
    checks = []
    if "kerple_log" in ppl:
        ratio = ppl["kerple_log"][16] / ppl["kerple_log"][1]
        checks.append((f"kerple_log stays flat or improves: ppl@16x / ppl@1x = {ratio:.3f} (<= 1.05)", ratio <= 1.05))
    if "sinusoidal" in ppl:
        ratio = ppl["sinusoidal"][8] / ppl["sinusoidal"][1]
        checks.append((f"sinusoidal degrades: ppl@8x / ppl@1x = {ratio:.2f} (>= 2)", ratio >= 2.0))
    if "rotary" in ppl:
        ratio = ppl["rotary"][16] / ppl["rotary"][1]
        checks.append((f"rotary degrades: ppl@16x / ppl@1x = {ratio:.2f} (>= 1.1)", ratio >= 1.1))
    for text, ok in checks:
        print(f"  [{'ok' if ok else 'NOT AS EXPECTED'}] {text}")
    return all(ok for _, ok in checks)


@entry_point("demo.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    load_modules("demo.py", "torch", "kerple.checkpoint.files", "kerple.config")  # before any work: Ctrl-C stops at once
    names = args.names
    threads = max(1, (os.cpu_count() or 2) // max(1, args.jobs))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    print(f"kerple demo: {len(names)} embeddings, train length {args.train_length}, {args.steps} steps of "
          f"{args.micro_batch}x{args.train_length} tokens at lr {args.lr:g}, evaluation at {', '.join(f'{f}x' for f in FACTORS)}; "
          f"{args.jobs} jobs x {threads} thread(s)", flush=True)
    explain_tokenizer(args, len(names))
    data = prepare_data(args)
    prepared = time.perf_counter()
    print(f"data ready in {prepared - started:.0f} s: {data.prefix} (vocab {data.vocab_size}, "
          f"{data.valid_tokens:,} validation tokens)", flush=True)

    set_aside_stale_runs(args, data, names)
    runner = Runner(total_steps=sum(0 if finished(ROOT / args.runs / n, args.steps) else args.steps for n in names),
                    threads=threads)
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for future in [pool.submit(runner.run, n, commands_for(n, args, data)) for n in names]:
                future_result(future)
    finally:
        runner.close()
    trained = time.perf_counter()

    from kerple.evaluation.compare import compare

    result_files = [ROOT / args.results / f"{n}.json" for n in names]
    if "rotary" in names:
        result_files += merge_zero_shot(ROOT / args.results, FACTORS)
    windowed = ROOT / args.results / "kerple_log-windowed.json"
    text, written = compare([*result_files, *([windowed] if windowed.is_file() else [])],
                            reference="kerple_log" if "kerple_log" in names else names[0])
    written += figures(args, data, names)
    print("\nPerplexity on the stdlib validation split (Table-3 layout; one seed, so no t-test marks):\n")
    print(text)
    ok = qualitative_check(args, names)
    for path in written:
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    total = time.perf_counter() - started
    print(f"\ntime: data {prepared - started:.0f} s, train + evaluate {trained - prepared:.0f} s, "
          f"report {time.perf_counter() - trained:.0f} s; total {total / 60:.1f} min ({total:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
