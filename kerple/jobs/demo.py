"""`make demo`: the KERPLE paper's extrapolation story in minutes on a CPU, with embedded data.

Prepares the Python standard library as a corpus with a byte-level BPE trained on it (why not the 20B
tokenizer is measured and printed); trains a tiny model (2 layers, width 128, train length 64) per
positional embedding; evaluates each at 1x-16x the train length (non-overlapping windows, the same
scored tokens at every length; KERPLE §5.2), KERPLE-log also with attention windowed to the train length
(§5.5) and rotary also zero-shot with PI, dynamic NTK and YaRN (``make demo-extension`` fine-tunes them);
prints the Table-3-style table, checks the paper's qualitative result and draws the figures. Outputs:
``runs/demo/<pos_emb>/`` and ``results/demo/``; a second run reuses the data and finished checkpoints.
What the three demos share: :mod:`kerple.jobs.demo_runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import closing
from pathlib import Path

from kerple.data.prepared import PreparedData
from kerple.errors import entry_point, load_modules
from kerple.jobs.demo_runs import (FACTORS, PYTHON, ROOT, Runner, config_args, evaluate_command, finished,
                                   parse_args, prepare_data, scaling_override, set_aside_stale_runs, shown_path)

KERNEL_EMBS = ("kerple_log", "kerple_power", "alibi", "rpe", "sandwich")
ZERO_SHOT = ("linear", "dynamic", "yarn")  # PI, dynamic NTK, YaRN
PER_LENGTH_FACTOR = ("linear", "yarn")  # factor = L'/L; dynamic rescales by the length itself


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


def zero_shot_commands(config: list[str], results: Path, train_length: int, num_tokens: int) -> list[list[str]]:
    """The trained rotary model (``config``) evaluated with each zero-shot method, into ``results/extension/``:
    PI and YaRN at factor s = L'/L for each length L' (the factor a user sets for a target length),
    dynamic NTK in one run (it rescales by the length itself)."""
    commands = []
    for method in ZERO_SHOT:
        factors = FACTORS[1:] if method in PER_LENGTH_FACTOR else (None,)
        for factor in factors:
            lengths = [train_length * f for f in ([factor] if factor else FACTORS)]
            name = f"rotary+{method}" + (f"@{factor}" if factor else "")
            commands.append(evaluate_command(config, results / "extension" / f"{name}.json", lengths, num_tokens,
                                             scaling_override(method, factor or 1, train_length)))
    return commands


def merge_zero_shot(results: Path) -> list[Path]:
    """One results file per method, ``results/rotary+<method>.json``: the per-length runs' rows, and at
    1x rotary's own row (factor 1 is no scaling for PI and YaRN)."""
    from kerple.atomic import write_json_atomic

    written = []
    for method in ZERO_SHOT:
        if method not in PER_LENGTH_FACTOR:
            merged = json.loads((results / "extension" / f"rotary+{method}.json").read_text())
        else:
            documents = [json.loads((results / "extension" / f"rotary+{method}@{f}.json").read_text())
                         for f in FACTORS[1:]]
            plain = json.loads((results / "rotary.json").read_text())["results"][0]
            merged = {**documents[0], "results": [plain] + [row for doc in documents for row in doc["results"]]}
            merged["run"] = {**merged["run"], "scaling_factor_per_length": {
                str(row["length"]): row["length"] // plain["length"] for row in merged["results"]}}
        write_json_atomic(results / f"rotary+{method}.json", merged)
        written.append(results / f"rotary+{method}.json")
    return written


def commands_for(pos_emb: str, args: argparse.Namespace, data: PreparedData) -> list[list[str]]:
    """train.py (unless finished) then evaluate.py; KERPLE-log also evaluated windowed (§5.5), rotary
    also zero-shot with PI, dynamic NTK and YaRN."""
    common = config_args(pos_emb, args, data)
    lengths = [args.train_length * f for f in FACTORS]
    results = Path(args.results)
    commands = [] if finished(ROOT / args.runs / pos_emb, args.steps) else [[PYTHON, "train.py", *common]]
    commands.append(evaluate_command(common, results / f"{pos_emb}.json", lengths, args.num_tokens, "--per-position"))
    if pos_emb == "kerple_log":
        commands.append(evaluate_command(common, results / f"{pos_emb}-windowed.json", lengths, args.num_tokens,
                                         "--per-position", "--attention-window", str(args.train_length)))
    if pos_emb == "rotary":
        commands += zero_shot_commands(common, ROOT / results, args.train_length, args.num_tokens)
    return commands


def figures(args: argparse.Namespace, data: PreparedData, names: list[str]) -> list[Path]:
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
        table = plots.bias_table(run.model.positional)
        written.append(plots.plot_kernels(table, results / f"kernels_{name}.png",
                                          title=f"{display_name(name)} kernels after {run.iteration} steps"))
        if name != "rpe":  # T5's bucketed bias is not a decreasing kernel: no effective length
            effective[display_name(name)] = plots.effective_lengths(table)
    written.append(plots.plot_effective_lengths(effective, results / "effective_lengths.png"))
    return written


def qualitative_check(args: argparse.Namespace, names: list[str]) -> bool:
    """The paper's story: KERPLE-log flat or better with length; sinusoidal and rotary degrade."""
    expectations = (("kerple_log", 16, "stays flat or improves", 1.05), ("sinusoidal", 8, "degrades", 2.0),
                    ("rotary", 16, "degrades", 1.1))
    ok = True
    for name, factor, story, bound in [e for e in expectations if e[0] in names]:
        rows = json.loads((ROOT / args.results / f"{name}.json").read_text())["results"]
        ppl = {r["length"] // args.train_length: r["ppl"] for r in rows}
        ratio = ppl[factor] / ppl[1]
        flat = name == "kerple_log"
        passed = ratio <= bound if flat else ratio >= bound
        shown = f"{ratio:.3f}" if flat else f"{ratio:.2f}"
        limit = f"<= {bound:g}" if flat else f">= {bound:g}"
        print(f"  [{'ok' if passed else 'NOT AS EXPECTED'}] {name} {story}: ppl@{factor}x / ppl@1x = {shown} ({limit})")
        ok = ok and passed
    return ok


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
          f"{data.tokens('valid'):,} validation tokens)", flush=True)

    set_aside_stale_runs(args, data, names)
    steps = sum(0 if finished(ROOT / args.runs / n, args.steps) else args.steps for n in names)
    with closing(Runner(total_steps=steps, threads=threads)) as runner:
        runner.run_many({n: commands_for(n, args, data) for n in names}, args.jobs)
    trained = time.perf_counter()

    from kerple.evaluation.compare import compare

    result_files = [ROOT / args.results / f"{n}.json" for n in names]
    if "rotary" in names:
        result_files += merge_zero_shot(ROOT / args.results)
    windowed = ROOT / args.results / "kerple_log-windowed.json"
    text, written = compare([*result_files, *([windowed] if windowed.is_file() else [])],
                            reference="kerple_log" if "kerple_log" in names else names[0])
    written += figures(args, data, names)
    print("\nPerplexity on the stdlib validation split (Table-3 layout; one seed, so no t-test marks):\n")
    print(text)
    ok = qualitative_check(args, names)
    for path in written:
        print(f"wrote {shown_path(path)}")
    total = time.perf_counter() - started
    print(f"\ntime: data {prepared - started:.0f} s, train + evaluate {trained - prepared:.0f} s, "
          f"report {time.perf_counter() - trained:.0f} s; total {total / 60:.1f} min ({total:.0f} s)")
    return 0 if ok else 1
