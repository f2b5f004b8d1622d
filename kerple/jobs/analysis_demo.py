"""`make analysis-demo`: why the demo's models extrapolate, with ``analyze.py`` (thesis §2.3, §4.5, ch. 5).

On ``make demo``'s checkpoints, at 8x the train length unless told: ``receptive-field`` for every
embedding (§4.5.1); ``align-temperature`` (P_max and entropy, Algorithm 1) and passkey ``retrieval``
(τ = 1, log (§5.5), the P_max-aligned τ) for KERPLE-log, ALiBi and T5; ``nope-variance`` of a random NoPE
model against Lemma 2.3 (§2.3); with ``--table41``, thesis Table 4.1 at the demo's scale (ALiBi slope
shifts, NoPE attention windows, trained here; §4.4-4.5). Each command's JSON and PNG and the summary
(``summary.md``, ``summary.json``) go to ``results/analysis/``; docs/analysis.md reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from kerple.analysis.errors import AnalysisError
from kerple.data.prepared import PreparedData
from kerple.errors import entry_point, load_modules
from kerple.flags import AT_LEAST_1, check_flags
from kerple.jobs import demo_runs
from kerple.jobs.demo_runs import ROOT, evaluate_command, finished
from kerple.jobs.process import run_child

ALIGNED = ("kerple_log", "alibi", "rpe")
TABLE_4_1 = {  # demo-scale thesis Table 4.1: variant -> (configs/pe file, override)
    **{f"alibi-shift{d}": ("alibi", f"alibi_slope_shift={d}") for d in (-3, 4, 8)},
    **{f"window{w}": ("none", f"attention_window={w}") for w in (8, 16, 32, 64)},
}


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """This script's options; the rest are ``make demo``'s (``--steps``, ``--runs``, ...), the
    ones the analysed demo was run with."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Other options are make demo's: give the ones make demo ran with "
                                            "(e.g. --steps 200) so that its checkpoints are found.")
    parser.add_argument("--factor", type=int, default=8, help="analysis length = factor x train length")
    parser.add_argument("--num-sequences", type=int, default=8, help="held-out sequences per measurement")
    parser.add_argument("--num-samples", type=int, default=4, help="passkey prompts per length and depth")
    parser.add_argument("--results", default="results/analysis")
    parser.add_argument("--demo-results", help="where make demo wrote its perplexities (its --results; "
                                               "default: make demo's default, results/demo)")
    parser.add_argument("--table41", action="store_true", help="also train and analyse Table 4.1's variants")
    options, demo_argv = parser.parse_known_args(argv)
    check_flags(options, {"--factor": AT_LEAST_1, "--num-sequences": AT_LEAST_1, "--num-samples": AT_LEAST_1})
    return options, demo_argv


def demo_setup(demo_argv: list[str]) -> tuple[argparse.Namespace, PreparedData, list[str]]:
    """The demo's settings (its defaults, or the options it was run with), its prepared data and the
    embeddings with a finished checkpoint; refuses (``AnalysisError``) when there is none, naming
    the step counts the runs found were trained for."""
    args = demo_runs.parse_args(demo_argv)
    names = [n for n in args.names if finished(ROOT / args.runs / n, args.steps)]
    if not demo_runs.info_file(args).is_file():
        raise AnalysisError(f"no demo data in {args.data_dir} (the data of --vocab {args.vocab}); run `make demo` "
                            "first, or give the demo's own options (e.g. --vocab)")
    if not names:
        raise AnalysisError(no_checkpoints(args))
    return args, demo_runs.read_data(args), names


def no_checkpoints(args: argparse.Namespace) -> str:
    """Why no finished demo run was found: none at all, or runs trained for another number of steps."""
    from kerple.checkpoint.files import latest_tag

    other = {}
    for name in args.names:
        folder = ROOT / args.runs / name
        tag = latest_tag(folder) if folder.is_dir() else None
        if tag is not None:
            other.setdefault(tag.removeprefix("global_step"), []).append(name)
    if not other:
        return f"no demo checkpoints under {args.runs}/<pos_emb>/; run `make demo` first"
    found = "; ".join(f"step {steps} ({', '.join(names)})" for steps, names in other.items())
    steps = next(iter(other))
    return (f"the demo runs under {args.runs}/ end at {found}, not at step {args.steps} (--steps {args.steps}): "
            f"give the demo's --steps, e.g. make analysis-demo ANALYSIS_ARGS='--steps {steps}'")


def analyze(command: list[str]) -> None:
    """One ``analyze.py`` run as a user types it (progress bars off; the error, if any, shown)."""
    print("$ python analyze.py " + " ".join(command[:2]) + " ... " + " ".join(command[-2:]), flush=True)
    outcome = run_child([sys.executable, "analyze.py", *command, "--no-progress"], capture=True, session=False)
    lines = [line for line in outcome.tail if " -> " not in line]
    for line in lines[-4:]:
        print("  " + line)
    outcome.check(f"analyze.py {command[0]}")


def perplexities(results_dir: Path, name: str) -> dict[str, float]:
    """Perplexity by length from ``make demo``'s ``results/demo/<name>.json`` (empty if absent)."""
    path = results_dir / f"{name}.json"
    if not path.is_file():
        return {}
    return {str(row["length"]): row["ppl"] for row in json.loads(path.read_text())["results"]}


def perplexity_cell(ppl: dict[str, float], length: int) -> str:
    """A perplexity for the tables, or ``n/a`` when that run or length was not evaluated."""
    value = ppl.get(str(length))
    return "n/a" if value is None else f"{value:.1f}"


def tau_cell(row: dict[str, Any], mode: str) -> str:
    """Algorithm 1's τ, marked † when the grid did not reach the train-length statistic."""
    return f"{row[f'tau_{mode}']:g}" + ("" if row[f"{mode}_reached"] else " †")


def summary_table(summary: dict[str, Any], train_length: int, length: int) -> str:
    """The Markdown tables of the README section."""
    lines = [f"Empirical receptive field at L = {length} (train length {train_length}) beside the demo's perplexity:",
             "", f"| embedding | ERF (tokens) | gradient share in the last {train_length} | ppl @ {train_length} | "
             f"ppl @ {length} |", "|---|---:|---:|---:|---:|"]
    for name, row in summary["receptive_field"].items():
        ppl = row["ppl"]
        lines.append(f"| {name} | {row['erf']} | {row['share_in_train_length']:.3f} | "
                     f"{perplexity_cell(ppl, train_length)} | {perplexity_cell(ppl, length)} |")
    if any(not row["ppl"] for row in summary["receptive_field"].values()):
        lines += ["", f"n/a: no perplexity in {summary['perplexities_from']}/<embedding>.json (give make demo's "
                  "--results as --demo-results)"]
    factor = length // train_length
    lines += ["", f"Attention sharpness (mean over layers, heads and rows) and Algorithm 1's τ, {factor}x:",
              "", f"| embedding | P_max @ {train_length} | P_max @ {length} | entropy @ {train_length} (nats) | "
              f"entropy @ {length} (nats) | τ (P_max) | τ (entropy) | log_L(L_tr) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in summary["alignment"].items():
        lines.append(f"| {name} | {row['pmax_train']:.4f} | {row['pmax_long']:.4f} | {row['entropy_train']:.3f} | "
                     f"{row['entropy_long']:.3f} | {tau_cell(row, 'pmax')} | {tau_cell(row, 'entropy')} | "
                     f"{row['tau_log']:.3f} |")
    if any(not row[f"{mode}_reached"] for row in summary["alignment"].values() for mode in ("pmax", "entropy")):
        lines += ["", "†: the grid's end; no τ in [0.5, 1] brings the statistic back to its train-length value "
                  "(not aligned)."]
    lines += ["", "Passkey accuracy (all depths) by length and temperature:", ""]
    for name, runs in summary["passkey"].items():
        for setting, accuracy in runs.items():
            lines.append(f"- {name}, τ = {setting}: " + ", ".join(f"L={k}: {v:.2f}" for k, v in accuracy.items()))
    if "table41" in summary:
        lengths = [str(train_length * f) for f in (1, 2, 4, 8) if train_length * f <= length]
        lines += ["", f"Thesis Table 4.1 at the demo's scale (2 layers, train length {train_length}):", "",
                  "| variant | ERF | share in the last " + str(train_length) + " | "
                  + " | ".join(f"ppl @ {n}" for n in lengths) + " |", "|---|---:|---:|" + "---:|" * len(lengths)]
        for variant, row in summary["table41"].items():
            lines.append(f"| {variant} | {row['erf']} | {row['share_in_train_length']:.3f} | "
                         + " | ".join(perplexity_cell(row["ppl"], int(n)) for n in lengths) + " |")
    nope = summary["nope_variance"]
    lines += ["", f"NoPE variance of a random model (d = {nope['hidden_size']}, σ = {nope['sigma']}): "
              f"measured / Lemma 2.3 at m = 1, {nope['length'] // 8}, {nope['length']}: "
              + ", ".join(f"{r:.3f}" for r in nope["ratios"])]
    return "\n".join(lines) + "\n"


def receptive_field(words: list[str], label: str, output: Path, length: int,
                    sequences: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``receptive-field`` of one model: its curve, its ERF and its gradient share within the train length."""
    analyze(["receptive-field", *words, "--length", str(length), "--num-sequences", str(sequences),
             "--labels", label, "--output", str(output)])
    run = json.loads(output.read_text())["runs"][label]
    return run, {"erf": run["erf"], "share_in_train_length": run["share_in_train_length"]}


def receptive_fields(common: dict[str, list[str]], options: argparse.Namespace, args: argparse.Namespace,
                     out: Path, length: int, demo_results: Path) -> dict[str, Any]:
    """``receptive-field`` for every embedding, one plot of all; ERF, share within the train length, ppl."""
    from kerple.analysis.common import save_figure
    from kerple.analysis.receptive_field import plot_receptive_fields

    runs, summary = {}, {}
    for name, words in common.items():
        runs[name], summary[name] = receptive_field(words, name, out / f"receptive_field_{name}.json", length,
                                                    options.num_sequences)
        summary[name]["ppl"] = perplexities(demo_results, name)
    title = f"Demo models: cumulative normalized gradient, L = {length}"
    save_figure(plot_receptive_fields(runs, args.train_length, title), out / "receptive_field.png")
    return summary


def alignment_and_passkey(name: str, words: list[str], options: argparse.Namespace, out: Path,
                          length: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``align-temperature`` (both modes), then passkey retrieval with τ = 1, log and the P_max τ."""
    output = out / f"align_{name}.json"
    analyze(["align-temperature", *words, "--length", str(length), "--mode", "both",
             "--num-sequences", str(max(1, options.num_sequences // 2)), "--output", str(output)])
    doc = json.loads(output.read_text())
    pmax, entropy = doc["modes"]["pmax"], doc["modes"]["entropy"]
    alignment = {"pmax_train": pmax["target"], "pmax_long": pmax["grid"]["1"], "entropy_train": entropy["target"],
                 "entropy_long": entropy["grid"]["1"], "tau_pmax": pmax["temperature"],
                 "tau_entropy": entropy["temperature"], "tau_log": doc["log_baseline"],
                 "pmax_reached": pmax["reached"], "entropy_reached": entropy["reached"]}
    output = out / f"passkey_{name}.json"
    lengths = ",".join(str(n) for n in (128, 256, 512, 1024) if n <= length)
    analyze(["retrieval", *words, "--task", "passkey", "--lengths", lengths, "--depths", "0,0.5,1",
             "--num-samples", str(options.num_samples), "--temperatures", f"1,log,{pmax['temperature']:g}",
             "--output", str(output)])
    return alignment, json.loads(output.read_text())["accuracy"]


def nope_variance(words: list[str], out: Path, length: int) -> dict[str, Any]:
    """``nope-variance`` of a random NoPE model of the demo's size; measured / lemma at three positions."""
    words = [*words]
    words[1] = "configs/pe/none.yml"
    output = out / "nope_variance.json"
    analyze(["nope-variance", *words, "--length", str(length), "--samples", "500", "--output", str(output)])
    nope = json.loads(output.read_text())
    return {"hidden_size": nope["hidden_size"], "sigma": nope["sigma"], "length": length,
            "ratios": [nope["random_model"][m - 1] / nope["lemma"][m - 1] for m in (1, length // 8, length)]}


def variant_args(variant: str, args: argparse.Namespace, data: PreparedData) -> list[str]:
    """The demo's config arguments for a Table 4.1 variant, saved under ``<runs>-table41/<variant>``."""
    pe, override = TABLE_4_1[variant]
    folder = f"{args.runs}-table41/{variant}"
    words = [w for w in demo_runs.config_args(pe, args, data) if not w.startswith(("save=", "load=", "log_dir="))]
    return [*words, override, f"save={folder}", f"load={folder}", f"log_dir={folder}/logs"]


def table41(args: argparse.Namespace, data: PreparedData, out: Path, length: int,
            summary: dict[str, Any]) -> dict[str, Any]:
    """Train the variants (unless finished, two at a time), then perplexity at 1x-8x and the receptive field."""
    words = {variant: variant_args(variant, args, data) for variant in TABLE_4_1}
    todo = [v for v in TABLE_4_1 if not finished(ROOT / f"{args.runs}-table41" / v, args.steps)]
    with closing(demo_runs.Runner(total_steps=args.steps * len(todo), threads=1)) as runner:
        runner.run_many({v: [[sys.executable, "train.py", *words[v]]] for v in todo}, workers=2)
    lengths = [args.train_length * f for f in (1, 2, 4, 8) if args.train_length * f <= length]
    rows = {"alibi-shift0": {**summary["receptive_field"].get("alibi", {})}}
    for variant in TABLE_4_1:
        output = out / f"table41_{variant}_ppl.json"
        run_child(evaluate_command(words[variant], output, lengths, args.num_tokens), capture=True,
                  session=False).check(f"evaluate.py of {variant}")
        _, rows[variant] = receptive_field(words[variant], variant, out / f"table41_{variant}_rf.json", length, 8)
        rows[variant]["ppl"] = perplexities(out, f"table41_{variant}_ppl")
    return rows


@entry_point("analysis_demo.py")
def main(argv: list[str] | None = None) -> int:
    from kerple.atomic import write_json_atomic, write_text_atomic

    options, demo_argv = parse_args(argv)
    load_modules("analysis_demo.py", "kerple.checkpoint.files", "kerple.config", "tokenizers")  # Ctrl-C: at once
    started = time.perf_counter()
    args, data, names = demo_setup(demo_argv)
    out = ROOT / options.results
    length = args.train_length * options.factor
    common = {name: demo_runs.config_args(name, args, data) for name in names}
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    demo_results = ROOT / (options.demo_results or args.results)
    summary: dict[str, Any] = {"train_length": args.train_length, "length": length, "alignment": {}, "passkey": {},
                               "perplexities_from": os.path.relpath(demo_results, ROOT),
                               "receptive_field": receptive_fields(common, options, args, out, length, demo_results)}
    for name in [n for n in ALIGNED if n in names]:
        summary["alignment"][name], summary["passkey"][name] = alignment_and_passkey(
            name, common[name], options, out, length)
    summary["nope_variance"] = nope_variance(common[names[0]], out, length)
    if options.table41:
        summary["table41"] = table41(args, data, out, length, summary)
    write_json_atomic(out / "summary.json", summary)
    text = summary_table(summary, args.train_length, length)
    write_text_atomic(out / "summary.md", text)
    print("\n" + text)
    print(f"wrote {options.results}/ in {time.perf_counter() - started:.0f} s")
    return 0
