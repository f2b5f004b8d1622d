"""Write the paper's experiment grid: embedding x dataset x seed (1235-1239) x train length (512, 1024).

Like the reference's generator, every run gets its own small YAML holding what varies (seed,
sequence length, save/load/log/tensorboard directories) and is composed with the shared files:

    python deepy.py train.py configs/models/162M.yml configs/pe/<pe>.yml configs/data/<data>.yml <run>.yml

    python tools/generate_ymls.py                      # writes configs/generated/ and run_all.sh
    python tools/generate_ymls.py --pe kerple_log alibi --data github --seeds 1235 --model 1-3B
    python tools/generate_ymls.py --grid table4.1      # thesis Table 4.1: ALiBi variants, windowed attention
    python tools/generate_ymls.py --grid beyond        # FIRE, CABLE, xPos beside KERPLE-log and ALiBi
    python tools/generate_ymls.py --grid extension     # rotary + PI / YaRN fine-tuned beside KERPLE-log and ALiBi

``--grid table4.1`` writes the thesis' §4.4 experiments instead of the embedding grid: ALiBi with
every slope exponent shifted by Δ (``alibi-slope-shift``), ALiBi with one slope for all heads
(``alibi-equal-slope``), and attention restricted to a window of w keys without a positional
embedding (``attention-window``, §4.3.3); by default on ArXiv and OpenWebText2, train length 512,
seed 1235, as in Tables 4.1 and 4.4. ``analyze.py receptive-field`` then measures what explains
their perplexities (§4.5).

``--grid beyond`` writes the embedding grid for the methods that came after KERPLE (FIRE, CABLE,
xPos) beside KERPLE-log and ALiBi, on the paper's datasets, seeds and train lengths: the same
trainer, data and evaluation for all of them, so their published comparisons with KERPLE can be
repeated here.

``--grid extension`` writes the comparison with RoPE context extension (docs/context-extension.md):
the rotary, KERPLE-log and ALiBi runs of the paper's grid, then, from each finished run, a
fine-tuning at four times its length for 400 steps (``finetune: true``, the same tokens per step):
rotary with Position Interpolation (linear, factor 4) and with YaRN (factor 4), and rotary,
KERPLE-log and ALiBi without scaling, given the same steps at the same length. The zero-shot
columns need no training: ``evaluate.py`` on the rotary run with the scaling as an override.
"""

from __future__ import annotations

import argparse
import sys
from itertools import product
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kerple.atomic import write_text_atomic  # noqa: E402
from kerple.errors import UsageError, entry_point  # noqa: E402
from kerple.flags import AT_LEAST_0, AT_LEAST_1, check_number, check_unique, given_flags  # noqa: E402
from kerple.outputs import check_output_folder  # noqa: E402

PAPER_EMBEDDINGS = ["sinusoidal", "rotary", "rpe", "alibi", "kerple_power", "kerple_log"]  # KERPLE paper, Table 3
PAPER_DATASETS = ["openwebtext2", "github", "arxiv"]
PAPER_SEEDS = [1235, 1236, 1237, 1238, 1239]
PAPER_LENGTHS = [512, 1024]
TABLE_4_1 = {  # thesis Table 4.1: variant name -> (configs/pe file, keys that differ)
    **{f"alibi-shift{shift}": ("alibi", {"alibi-slope-shift": shift}) for shift in (-3, 0, 2, 4, 6, 8)},
    **{f"alibi-same-h{h}": ("alibi", {"alibi-equal-slope": h}) for h in (0, 2, 4, 6, 8)},
    **{f"window{w}": ("none", {"attention-window": w}) for w in (40, 80, 100, 120, 160, 320)},
}
BEYOND_KERPLE = ["kerple_log", "alibi", "fire", "cable", "xpos"]  # the later methods beside their baselines
PAPER_GRID = {"data": PAPER_DATASETS, "lengths": PAPER_LENGTHS, "seeds": PAPER_SEEDS}
EXTENSION_FACTOR, EXTENSION_STEPS, EXTENSION_LR = 4, 400, 6e-5  # YaRN §4: 400 steps at s = 16; lr a tenth of Table 2's
EXTENSION_FINETUNES = {  # fine-tuned variant -> (its base variant, rope_type or None)
    "rotary+pi-ft4x": ("rotary", "linear"),
    "rotary+yarn-ft4x": ("rotary", "yarn"),
    "rotary-ft4x": ("rotary", None),
    "kerple_log-ft4x": ("kerple_log", None),
    "alibi-ft4x": ("alibi", None),
}
GRIDS = {  # grid name -> (variant name -> (configs/pe file, keys that differ), default data/lengths/seeds)
    "table4.1": (TABLE_4_1, {"data": ["arxiv", "openwebtext2"], "lengths": [512], "seeds": [1235]}),
    "beyond": ({pe: (pe, {}) for pe in BEYOND_KERPLE}, PAPER_GRID),
    "extension": ({pe: (pe, {}) for pe in ("rotary", "kerple_log", "alibi")}, PAPER_GRID),
}


def run_name(model: str, pe: str, data: str, length: int, seed: int) -> str:
    return f"{model}_{pe}_{data}_len{length}_seed{seed}"


def run_config(name: str, length: int, seed: int, runs_dir: str) -> dict:
    """The keys that differ between runs of the grid."""
    root = f"{runs_dir}/{name}"
    return {
        "seed": seed,
        "seq-length": length,
        "max-position-embeddings": length,
        "save": f"{root}/checkpoints",
        "load": f"{root}/checkpoints",
        "log-dir": f"{root}/logs",
        "tensorboard-dir": f"{root}/tensorboard",
    }


def finetune_config(name: str, base: str, rope_type: str | None, length: int, runs_dir: str) -> dict:
    """The keys of a fine-tuning at ``EXTENSION_FACTOR`` times ``length`` from the finished run ``base``
    (weights only, the same tokens per step as configs/models/162M.yml's 32 x 512), with ``rope_type``'s scaling."""
    longer = EXTENSION_FACTOR * length
    keys: dict = {
        "finetune": True, "load": f"{runs_dir}/{base}/checkpoints", "seq-length": longer, "max-position-embeddings": longer,
        "train_micro_batch_size_per_gpu": max(1, 32 // EXTENSION_FACTOR), "train-iters": EXTENSION_STEPS,
        "lr-decay-iters": EXTENSION_STEPS, "lr": EXTENSION_LR,
    }
    if rope_type is not None:
        from kerple.positional.rotary import extension_options

        keys.update(extension_options(rope_type, EXTENSION_FACTOR, length))
    root = f"{runs_dir}/{name}"
    return {**keys, "save": f"{root}/checkpoints", "log-dir": f"{root}/logs", "tensorboard-dir": f"{root}/tensorboard"}


def config_names(folder: str) -> list[str]:
    """The YAML files of ``configs/<folder>/`` by name (the choices of --model, --pe, --data)."""
    return sorted(path.stem for path in (REPO / "configs" / folder).glob("*.yml"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="generate_ymls.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="generate_ymls.py [--grid NAME | --pe PE ...] [--model M] [--data D ...] [--seeds S ...] "
              "[--lengths L ...] [--out DIR] [--runs-dir DIR]",
    )
    parser.add_argument("--model", default="162M", choices=config_names("models"), help="configs/models/<model>.yml")
    parser.add_argument("--pe", nargs="+", default=PAPER_EMBEDDINGS, choices=config_names("pe"), metavar="PE",
                        help=f"configs/pe/<pe>.yml, among: {', '.join(config_names('pe'))}")
    parser.add_argument("--data", nargs="+", choices=config_names("data"), metavar="DATA",
                        help=f"configs/data/<data>.yml, among: {', '.join(config_names('data'))} "
                             f"(default: {' '.join(PAPER_DATASETS)}; table4.1: arxiv openwebtext2)")
    parser.add_argument("--seeds", nargs="+", type=int, help=f"default: {PAPER_SEEDS} (table4.1: 1235)")
    parser.add_argument("--lengths", nargs="+", type=int, help=f"train lengths (default: {PAPER_LENGTHS}; table4.1: 512)")
    parser.add_argument("--grid", choices=sorted(GRIDS), help="a named grid instead of --pe (see above)")
    parser.add_argument("--out", default="configs/generated", help="where the run YAMLs go")
    parser.add_argument("--runs-dir", default="runs", help="parent of each run's checkpoints/ and logs/")
    args = parser.parse_args(argv)
    for flag, bounds in (("--lengths", AT_LEAST_1), ("--seeds", AT_LEAST_0)):
        for value in getattr(args, flag[2:]) or []:
            check_number(flag, value, bounds)
    for flag in ("--pe", "--data", "--seeds", "--lengths"):
        check_unique(flag, getattr(args, flag[2:]))
    if args.grid and "pe" in given_flags(parser, argv):
        names = ", ".join(dict.fromkeys(pe for pe, _ in GRIDS[args.grid][0].values()))
        raise UsageError(f"--pe with --grid {args.grid}: the grid names its own embeddings ({names}); "
                         "drop --pe, or drop --grid to write the embedding grid of --pe")
    check_output_folder(args.out, "--out")
    return args


def write_run(path: Path, header: str, settings: dict, model_file: str, pe: str, data: str) -> str:
    """Write one run's YAML (atomically) and return the command that trains it."""
    write_text_atomic(path, f"# generated by tools/generate_ymls.py: {header}\n" + yaml.safe_dump(settings, sort_keys=False))
    return f"python deepy.py train.py {model_file} configs/pe/{pe}.yml configs/data/{data}.yml {path}"


def finetune_commands(args: argparse.Namespace, model_file: str, out: Path) -> list[str]:
    """Write the extension grid's fine-tuning YAMLs (after their base runs in run_all.sh); their commands."""
    commands = []
    for data, (variant, (base, rope_type)), length, seed in product(args.data, EXTENSION_FINETUNES.items(),
                                                                    args.lengths, args.seeds):
        name = run_name(args.model, variant, data, length, seed)
        base_name = run_name(args.model, base, data, length, seed)
        settings = {"seed": seed, **finetune_config(name, base_name, rope_type, length, args.runs_dir)}
        commands.append(write_run(out / data / variant / f"{name}.yml", f"{name}, fine-tuned from {base_name}",
                                  settings, model_file, base, data))
    return commands


@entry_point("generate_ymls.py")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    variants, defaults = GRIDS[args.grid] if args.grid else ({pe: (pe, {}) for pe in args.pe}, PAPER_GRID)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    model_file = f"configs/models/{args.model}.yml"
    out = Path(args.out)
    commands = []
    for data, (variant, (pe, keys)), length, seed in product(args.data, variants.items(), args.lengths, args.seeds):
        name = run_name(args.model, variant, data, length, seed)
        settings = {**keys, **run_config(name, length, seed, args.runs_dir)}
        commands.append(write_run(out / data / variant / f"{name}.yml", name, settings, model_file, pe, data))
    if args.grid == "extension":
        commands += finetune_commands(args, model_file, out)
    script = out / "run_all.sh"
    write_text_atomic(script, "#!/bin/sh\nset -e\n" + "\n".join(commands) + "\n")
    script.chmod(0o755)
    print(f"wrote {len(commands)} run configs under {out} and {script}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
