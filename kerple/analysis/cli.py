"""``analyze.py``: the subcommands, each a thin layer over its module (see the package docstring).

:data:`DESCRIPTION` and :data:`EXAMPLES` are the command's ``--help`` (plain text). Every subcommand
writes a JSON document and a PNG beside it (``--plot`` to choose its path).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from kerple.analysis import (
    align_temperature, attention_stats, nope_variance, position_probe, receptive_field, retrieval,
)
from kerple.analysis.common import (
    add_model_arguments, check_lengths, config_of, device_of, load_model, parse_lengths, png_beside,
    sample_windows, save_figure, temperature_at, write_json,
)
from kerple.analysis.errors import AnalysisError
from kerple.config import split_arguments
from kerple.errors import entry_point
from kerple.flags import POSITIVE, check_number
from kerple.outputs import check_output_file
from kerple.runs import checkpoint_folder


DESCRIPTION = "Why and where a trained checkpoint extrapolates (thesis chapters 2, 4.5 and 5)."
EXAMPLES = """\
examples:
  analyze.py receptive-field <ymls> --load DIR --length 2048 --output rf.json
  analyze.py attention-stats <ymls> --load DIR --lengths 512,4096 --output stats.json
  analyze.py align-temperature <ymls> --load DIR --length 4096 --mode pmax --output tau.json
  analyze.py retrieval <ymls> --load DIR --task passkey --lengths 512,1024 --temperatures 1,log --output r.json
  analyze.py nope-variance <ymls> [--load DIR] --length 512 --output nope.json
  analyze.py position-probe <ymls> --load DIR --length 512 --output probe.json

<ymls> are YAML config files, then KEY=VALUE overrides of any config key; with none, the run's own
config from the checkpoint's configs/ folder. Each subcommand writes its JSON and a PNG beside it
(--plot to choose the PNG's path); 'analyze.py COMMAND --help' lists its options.
"""


def single_load(args: argparse.Namespace) -> str | None:
    if args.load and len(args.load) > 1:
        raise AnalysisError("--load given more than once; only receptive-field compares several runs")
    return args.load[0] if args.load else None


def outputs(args: argparse.Namespace, doc: dict[str, Any], figure: Any) -> None:
    """Write the JSON and the PNG atomically and say where."""
    write_json(args.output, doc)
    plot = save_figure(figure, png_beside(args.output, args.plot))
    print(f"wrote {args.output} and {plot}")


def run_labels(args: argparse.Namespace) -> list[str] | None:
    """The ``--labels``, one per ``--load`` and all different (the results are keyed by them), or
    ``None`` when not given (each run is then labelled by its folder, so a folder given twice is refused).
    Without ``--load`` there is one run, the one the config's ``load`` names (or a random model)."""
    loads = args.load or []
    if args.labels is None:
        folders = [str(Path(load).resolve()) for load in loads]
        twice = sorted({load for load, folder in zip(loads, folders) if folders.count(folder) > 1})
        if twice:
            raise AnalysisError(f"--load {', '.join(twice)} given twice; each run is one --load (or give --labels)")
        return None
    labels = [label.strip() for label in args.labels.split(",")]
    if len(labels) != max(1, len(loads)):
        given = f"--load gives {len(loads)}" if loads else "without --load there is one run (the config's load)"
        raise AnalysisError(f"--labels names {len(labels)} run(s) ({args.labels}) but {given}; "
                            "give one label per --load, in the same order")
    twice = sorted({label for label in labels if labels.count(label) > 1 or not label})
    if twice:
        raise AnalysisError(f"--labels {args.labels!r}: each run needs its own non-empty label "
                            f"(repeated or empty: {', '.join(map(repr, twice))})")
    return labels


def run_receptive_field(args: argparse.Namespace) -> None:
    labels = run_labels(args)
    own_configs = not split_arguments(args.configs)[0]  # no YAML: every run is read with its own config
    cfg = config_of(args, quiet=own_configs)  # each run's own config is announced when it loads
    check_lengths(cfg, [args.length])
    for load in args.load or [None]:
        checkpoint_folder(cfg, load)  # every folder exists before any work
    windows = sample_windows(cfg, args.length + 1, args.num_sequences, args.seed)
    runs = {}
    for index, load in enumerate(args.load or [None]):
        run_cfg = config_of(args, load) if own_configs and load else cfg
        model, folder, iteration = load_model(run_cfg, load, args)
        # gradients of the input: a kernel with a backward on this device, as training would pick
        model.set_attention(model.gradient_attention_impl(device_of(args).type, args.length + 1))
        label = labels[index] if labels else folder
        result = receptive_field.receptive_field(model, windows, not args.no_progress)
        share = receptive_field.share_within(result["cumulative"], run_cfg.model.seq_length)
        runs[label] = {"load": folder, "iteration": iteration, "train_length": run_cfg.model.seq_length,
                       "share_in_train_length": share, **result}
        print(f"{label}: ERF {result['erf']} of {args.length} input tokens (the most recent tokens holding "
              f"{receptive_field.ERF_SHARE:.0%} of the normalized gradient); {share:.1%} of it within the last "
              f"{min(run_cfg.model.seq_length, args.length)} (the train length)", file=sys.stderr)
    train_length = cfg.model.seq_length
    title = f"Cumulative normalized gradient, L = {args.length}"
    figure = receptive_field.plot_receptive_fields(runs, train_length, title)
    first = next(iter(runs.values()))
    outputs(args, {"analysis": "receptive-field", "train_length": train_length, "configs": args.configs,
                   "cumulative": first["cumulative"], "erf": first["erf"], "runs": runs}, figure)


def run_attention_stats(args: argparse.Namespace) -> None:
    cfg = config_of(args)
    lengths = parse_lengths(args.lengths)
    check_lengths(cfg, lengths)
    taus = [temperature_at(args.temperature, length, cfg.model.seq_length) for length in lengths]
    model, folder, iteration = load_model(cfg, single_load(args), args)
    rows = []
    for length, tau in zip(lengths, taus):
        windows = sample_windows(cfg, length, args.num_sequences, args.seed)
        rows.append(attention_stats.attention_statistics(model, windows, tau, progress=not args.no_progress))
        print(f"L={length} τ={tau:.3f}: mean P_max {rows[-1]['mean_pmax']:.4f} (uniform attention: "
              f"{rows[-1]['uniform_pmax']:.4f}), mean entropy {rows[-1]['mean_entropy']:.4f} nats (uniform: "
              f"{rows[-1]['uniform_entropy']:.4f})", file=sys.stderr)
    setting = "1" if args.temperature is None else args.temperature
    figure = attention_stats.plot_statistics(rows, f"Attention sharpness ({cfg.positional.pos_emb}, τ = {setting})")
    outputs(args, {"analysis": "attention-stats", "load": folder, "iteration": iteration,
                   "train_length": cfg.model.seq_length, "lengths": rows}, figure)


def run_align_temperature(args: argparse.Namespace) -> None:
    cfg = config_of(args)
    train_length = args.train_length or cfg.model.seq_length
    if args.length <= train_length:
        raise AnalysisError(f"--length {args.length} must exceed --train-length {train_length} (Algorithm 1 aligns "
                            "an extrapolation length to the train length)")
    check_lengths(cfg, [args.length])
    model, folder, iteration = load_model(cfg, single_load(args), args)
    windows = {"train": sample_windows(cfg, train_length, args.num_sequences * args.length // train_length, args.seed),
               "extrapolation": sample_windows(cfg, args.length, args.num_sequences, args.seed)}
    cache: dict[tuple[str, float], dict[str, Any]] = {}

    def statistic(mode: str) -> Callable[[str, float], float]:
        def measure(which: str, tau: float) -> float:
            if (which, tau) not in cache:
                cache[which, tau] = attention_stats.attention_statistics(model, windows[which], tau, progress=False)
            return cache[which, tau][f"mean_{mode}"]
        return measure

    modes = align_temperature.MODES if args.mode == "both" else (args.mode,)
    from kerple.progress import progress_bar

    results = {}
    with progress_bar(total=len(align_temperature.GRID) * len(modes), desc="temperature grid", disable=args.no_progress) as bar:
        for mode in modes:
            results[mode] = align_temperature.align(statistic(mode), progress=lambda _tau: bar.update())
            print(align_temperature.describe(mode, results[mode], train_length, args.length), file=sys.stderr)
    log_baseline = temperature_at("log", args.length, train_length)
    figure = align_temperature.plot_alignment(results, f"Algorithm 1: L_tr = {train_length}, L_ex = {args.length}",
                                              log_baseline)
    doc = {"analysis": "align-temperature", "load": folder, "iteration": iteration, "train_length": train_length,
           "length": args.length, "log_baseline": log_baseline, "modes": results}
    if len(modes) == 1:
        doc.update(mode=modes[0], temperature=results[modes[0]]["temperature"], grid=results[modes[0]]["grid"])
    outputs(args, doc, figure)


class TemperedModel:
    """``model`` with the temperature of ``setting`` at each prompt's length, set when a prompt is
    read (a forward without a cache, or the first one into an empty cache)."""

    def __init__(self, model: torch.nn.Module, setting: str, train_length: int) -> None:
        self.model, self.setting, self.train_length = model, setting, train_length

    def new_cache(self) -> Any:
        return self.model.new_cache()

    def __call__(self, tokens: torch.Tensor, cache: Any = None) -> torch.Tensor:
        if cache is None or cache.position == 0:
            self.model.set_temperature(temperature_at(self.setting, tokens.shape[1], self.train_length))
        return self.model(tokens, cache=cache)


def run_retrieval(args: argparse.Namespace) -> None:
    from kerple.data.tokenizers import build_tokenizer

    cfg = config_of(args)
    lengths = parse_lengths(args.lengths)
    check_lengths(cfg, lengths)
    settings = [part.strip() for part in args.temperatures.split(",") if part.strip()]
    if not settings:
        raise AnalysisError(f"--temperatures {args.temperatures!r}: name at least one setting, e.g. 1,log,0.7")
    for setting in settings:
        temperature_at(setting, lengths[-1], cfg.model.seq_length, "--temperatures")
    try:
        depths = [float(part) for part in args.depths.split(",")]
    except ValueError:
        depths = [math.nan]
    if any(not 0.0 <= depth <= 1.0 for depth in depths):
        raise AnalysisError(f"--depths {args.depths!r}: expected comma-separated fractions of the context in [0, 1], "
                            "e.g. 0,0.5,1")
    data = cfg.data
    tokenizer = build_tokenizer(data.tokenizer_type, data.vocab_file, data.merge_file, data.tokenizer_file)
    prompts = retrieval.build_prompts(args.task, tokenizer.tokenize, lengths, depths, args.num_samples, args.seed)
    model, folder, iteration = load_model(cfg, single_load(args), args)
    device = device_of(args)
    runs = {}
    for setting in settings:
        tempered = TemperedModel(model, setting, cfg.model.seq_length)
        runs[setting] = retrieval.accuracy(tempered, prompts, device, tokenizer.vocab_size, not args.no_progress,
                                           desc=f"{args.task} τ={setting}")
        print(f"{args.task} accuracy (exact match of greedy decoding, {args.num_samples * len(depths)} prompts per "
              f"length) at τ={setting}: " + "  ".join(f"L={k}: {v:.2f}" for k, v in runs[setting]["accuracy"].items()),
              file=sys.stderr)
    model.set_temperature(1.0)
    figure = retrieval.plot_heatmaps(runs, f"{args.task} retrieval ({cfg.positional.pos_emb})")
    outputs(args, {"analysis": "retrieval", "task": args.task, "load": folder, "iteration": iteration,
                   "train_length": cfg.model.seq_length, "num_samples": args.num_samples, "seed": args.seed,
                   "accuracy": {s: r["accuracy"] for s, r in runs.items()},
                   "accuracy_by_depth": {s: r["accuracy_by_depth"] for s, r in runs.items()}}, figure)


def run_nope_variance(args: argparse.Namespace) -> None:
    from kerple.model import build_model

    if args.samples < 2 or (args.load and args.num_sequences < 2):
        flag = f"--samples {args.samples}" if args.samples < 2 else f"--num-sequences {args.num_sequences}"
        raise AnalysisError(f"{flag}: a variance over samples needs at least 2 (the thesis' Fig. 2.4 averages 500)")
    cfg = config_of(args, attention_impl="eager")
    check_lengths(cfg, [args.length])
    if cfg.positional.pos_emb != "none":  # its bias or rotation changes the variance the lemma predicts
        print(f"note: the random model has the config's {cfg.positional.pos_emb} embedding; Lemma 2.3 describes "
              "NoPE (configs/pe/none.yml)", file=sys.stderr)
    if args.load:
        checkpoint_folder(cfg, single_load(args))
    torch.manual_seed(args.seed)
    random_model = build_model(cfg, flex_compile=False).to(device_of(args)).eval()
    measured = nope_variance.random_model_variance(random_model, args.length, args.sigma, args.samples,
                                                   seed=args.seed, progress=not args.no_progress)
    lemma = nope_variance.lemma_variance(cfg.model.hidden_size, args.sigma, args.length)
    curves = {f"random model, σ = {args.sigma:g}": measured, "Lemma 2.3: d²σ⁴/m": lemma}
    logit_variance = nope_variance.logit_variance(cfg.model.hidden_size, cfg.model.num_attention_heads, args.sigma)
    if logit_variance > nope_variance.SMALL_LOGIT_VARIANCE:
        print(f"note: at σ = {args.sigma:g} the scaled logits' variance d²σ⁴/H is {logit_variance:.3g} (Lemma 2.2), "
              "not small: attention is not near uniform (Property 2.1) and Lemma 2.3 need not hold "
              "(thesis Fig. 2.5)", file=sys.stderr)
    doc = {"analysis": "nope-variance", "pos_emb": cfg.positional.pos_emb, "hidden_size": cfg.model.hidden_size,
           "num_heads": cfg.model.num_attention_heads, "sigma": args.sigma, "samples": args.samples,
           "logit_variance": logit_variance, "random_model": measured, "lemma": lemma}
    if args.load:
        model, folder, iteration = load_model(cfg, single_load(args), args)
        windows = sample_windows(cfg, args.length, args.num_sequences, args.seed)
        variance = nope_variance.trained_model_variance(model, windows, progress=not args.no_progress)
        doc["trained"] = {"load": folder, "iteration": iteration, "variance": variance}
        curves[f"checkpoint (step {iteration})"] = doc["trained"]["variance"]
    shown = sorted({1, max(args.length // 4, 1), max(args.length // 2, 1), args.length})  # positions m
    print("variance of the first attention output o_m (per coordinate, over samples) at position m:", file=sys.stderr)
    for label, curve in curves.items():
        print(f"{label}: " + "  ".join(f"m={m}: {curve[m - 1]:.4g}" for m in shown), file=sys.stderr)
    outputs(args, doc, nope_variance.plot_variance(curves, f"First-layer attention output ({cfg.positional.pos_emb})"))


def run_position_probe(args: argparse.Namespace) -> None:
    if args.length < 2:
        raise AnalysisError(f"--length {args.length}: a probe of the position needs at least 2 positions")
    if args.num_sequences < 2:
        raise AnalysisError(f"--num-sequences {args.num_sequences}: the probe is fitted on half the windows and "
                            "scored on the other half; give at least 2")
    cfg = config_of(args)
    check_lengths(cfg, [args.length])
    rows, weights = position_probe.fitting_windows(args.num_sequences) * args.length, cfg.model.hidden_size + 1
    if args.probe == "linear" and rows <= weights:  # least squares then interpolates: its test error means nothing
        needed = 2 * (weights // args.length + 1)
        raise AnalysisError(f"--num-sequences {args.num_sequences}: the linear probe's {weights} weights would be fitted "
                            f"on {rows} positions; give at least --num-sequences {needed} at --length {args.length}")
    model, folder, iteration = load_model(cfg, single_load(args), args)
    windows = sample_windows(cfg, args.length, args.num_sequences, args.seed)
    states = position_probe.hidden_states_by_layer(model, windows)
    errors = position_probe.probe_errors(states, args.probe, progress=not args.no_progress)
    baseline = position_probe.constant_guess_error(args.length)
    print(f"position MAE (tokens) by layer, 0 = embeddings: " + ", ".join(f"{e:.1f}" for e in errors)
          + f"; the best constant guess scores {baseline:.1f}", file=sys.stderr)
    figure = position_probe.plot_probe({cfg.positional.pos_emb: errors}, args.length, f"Position probe ({args.probe})")
    outputs(args, {"analysis": "position-probe", "load": folder, "iteration": iteration, "length": args.length,
                   "probe": args.probe, "mae": errors, "constant_guess_mae": baseline}, figure)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """``analyze.py``'s parser and its subcommands' parsers by name."""
    parser = argparse.ArgumentParser(prog="analyze.py", usage="analyze.py COMMAND [CONFIG.yml ...] [KEY=VALUE ...] "
                                     "[--load DIR] --output FILE.json [options]", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], None], help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text,
                                  usage=f"analyze.py {name} [CONFIG.yml ...] [KEY=VALUE ...] --load DIR ... [options]")
        add_model_arguments(sub, load_required=name == "receptive-field")
        sub.add_argument("--output", required=True, help="result JSON (written atomically); the PNG goes beside it")
        sub.add_argument("--plot", help="PNG path (default: the output with .png)")
        sub.set_defaults(run=run)
        return sub

    sub = command("receptive-field", run_receptive_field, "empirical receptive field (thesis §4.5.1, Fig. 4.4)")
    sub.add_argument("--length", type=int, required=True, help="input tokens before the predicted one")
    sub.add_argument("--num-sequences", type=int, default=16, help="held-out sequences averaged")
    sub.add_argument("--labels", help="comma-separated plot labels, one per --load")

    sub = command("attention-stats", run_attention_stats, "mean P_max and entropy per layer and head (Table 5.1)")
    sub.add_argument("--lengths", required=True, help="comma-separated lengths, e.g. 512,4096")
    sub.add_argument("--temperature", help="softmax temperature in (0, 1], or 'log' (default 1)")
    sub.add_argument("--num-sequences", type=int, default=4)

    sub = command("align-temperature", run_align_temperature, "attention alignment by temperature (Algorithm 1)")
    sub.add_argument("--train-length", type=int, help="L_tr (default: the config's seq_length)")
    sub.add_argument("--length", type=int, required=True, help="L_ex, the extrapolation length")
    sub.add_argument("--mode", choices=(*align_temperature.MODES, "both"), default="pmax")
    sub.add_argument("--num-sequences", type=int, default=4, help="sequences of L_ex (as many tokens at L_tr)")

    sub = command("retrieval", run_retrieval, "passkey / line retrieval accuracy by length and depth (chapter 5)")
    sub.add_argument("--task", choices=retrieval.TASKS, default="passkey")
    sub.add_argument("--lengths", required=True)
    sub.add_argument("--depths", default=",".join(f"{d:g}" for d in retrieval.DEPTHS))
    sub.add_argument("--num-samples", type=int, default=10, help="prompts per length and depth")
    sub.add_argument("--temperatures", default="1", help="comma-separated settings: numbers in (0, 1] and/or 'log'")

    sub = command("nope-variance", run_nope_variance, "variance of the first attention output by position (§2.3)")
    sub.add_argument("--length", type=int, required=True)
    sub.add_argument("--sigma", type=float, default=0.02, help="std of the random model's attention weights")
    sub.add_argument("--samples", type=int, default=500)
    sub.add_argument("--num-sequences", type=int, default=64, help="held-out windows for --load")

    sub = command("position-probe", run_position_probe, "position probe MAE per layer (thesis Fig. 2.2)")
    sub.add_argument("--length", type=int, required=True)
    sub.add_argument("--num-sequences", type=int, default=16, help="half fit the probe, half score it")
    sub.add_argument("--probe", choices=position_probe.PROBES, default="linear")
    return parser, commands.choices


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """The subcommand's arguments, with the config words (YAML files, ``key=value``) anywhere among
    its flags (argparse's intermixed parsing, which a parser with subcommands cannot do itself)."""
    parser, subcommands = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in subcommands:
        args = subcommands[words[0]].parse_intermixed_args(words[1:])
        args.command = words[0]
        return args
    return parser.parse_args(words)  # --help, or no or an unknown command: argparse's own message


@entry_point("analyze.py")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``analyze.py``; returns 2 on bad input."""
    args = parse_arguments(argv)
    yamls = split_arguments(args.configs)[0]
    loads = args.load or []  # --load appends: a list, or None
    if args.plot is None and png_beside(args.output, None) == Path(args.output):
        raise AnalysisError(f"--output {args.output}: the JSON result goes there and its PNG beside it with .png; "
                            f"name a .json file, e.g. --output {Path(args.output).with_suffix('.json')}")
    check_output_file(args.output, "--output", inputs=yamls, folders=loads)
    check_output_file(png_beside(args.output, args.plot), "--plot", inputs=[*yamls, args.output], folders=loads)
    for name in ("length", "num_sequences", "num_samples", "samples", "train_length"):
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            raise AnalysisError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be positive")
    if getattr(args, "sigma", None) is not None:
        check_number("--sigma", args.sigma, POSITIVE)
    try:
        args.run(args)
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        raise AnalysisError(out_of_memory_message(args)) from None
    return 0


def is_out_of_memory(error: RuntimeError) -> bool:
    """A GPU's ``OutOfMemoryError``, or the CPU allocator's refusal (a plain ``RuntimeError``)."""
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)


def out_of_memory_message(args: argparse.Namespace) -> str:
    """One line for a measurement that did not fit in memory: the flags that size it."""
    length = f"--length {args.length}" if getattr(args, "length", None) else f"--lengths {args.lengths}"
    return (f"{args.command} ran out of memory on {device_of(args).type} at {length}; give a smaller length, "
            "or run it on a device with more memory (--device)")
