"""Write the paper's experiment grid: embedding x dataset x seed (1235-1239) x train length (512, 1024).

Like the reference's generator, every run gets its own small YAML holding what varies (seed,
sequence length, save/load/log/tensorboard directories) and is composed with the shared files:

    python deepy.py train.py configs/models/162M.yml configs/pe/<pe>.yml configs/data/<data>.yml <run>.yml

    python tools/generate_ymls.py                      # writes configs/generated/ and run_all.sh
    python tools/generate_ymls.py --pe kerple_log alibi --data github --seeds 1235 --model 1-3B
    python tools/generate_ymls.py --grid table4.1      # thesis Table 4.1: ALiBi variants, windowed attention
    python tools/generate_ymls.py --grid beyond        # FIRE, CABLE, xPos beside KERPLE-log and ALiBi

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
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kerple.atomic import write_text_atomic  # noqa: E402
from kerple.errors import UsageError, entry_point  # noqa: E402
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
GRIDS = {  # grid name -> (variant name -> (configs/pe file, keys that differ), default data/lengths/seeds)
    "table4.1": (TABLE_4_1, {"data": ["arxiv", "openwebtext2"], "lengths": [512], "seeds": [1235]}),
    "beyond": ({pe: (pe, {}) for pe in BEYOND_KERPLE}, PAPER_GRID),
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
    for flag, values in (("--lengths", args.lengths), ("--seeds", args.seeds)):
        bad = [value for value in values or [] if value < (1 if flag == "--lengths" else 0)]
        if bad:
            raise UsageError(f"{flag} {bad[0]}: expected {'positive train lengths' if flag == '--lengths' else 'seeds >= 0'}")
    check_output_folder(args.out, "--out")
    return args


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
    for data in args.data:
        for variant, (pe, keys) in variants.items():
            for length in args.lengths:
                for seed in args.seeds:
                    name = run_name(args.model, variant, data, length, seed)
                    path = out / data / variant / f"{name}.yml"
                    header = f"# generated by tools/generate_ymls.py: {name}\n"
                    settings = {**keys, **run_config(name, length, seed, args.runs_dir)}
                    write_text_atomic(path, header + yaml.safe_dump(settings, sort_keys=False))
                    commands.append(
                        f"python deepy.py train.py {model_file} configs/pe/{pe}.yml configs/data/{data}.yml {path}"
                    )
    script = out / "run_all.sh"
    write_text_atomic(script, "#!/bin/sh\nset -e\n" + "\n".join(commands) + "\n")
    script.chmod(0o755)
    print(f"wrote {len(commands)} run configs under {out} and {script}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
