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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="162M", help="configs/models/<model>.yml")
    parser.add_argument("--pe", nargs="+", default=PAPER_EMBEDDINGS)
    parser.add_argument("--data", nargs="+", help=f"default: {' '.join(PAPER_DATASETS)} (table4.1: arxiv openwebtext2)")
    parser.add_argument("--seeds", nargs="+", type=int, help=f"default: {PAPER_SEEDS} (table4.1: 1235)")
    parser.add_argument("--lengths", nargs="+", type=int, help=f"default: {PAPER_LENGTHS} (table4.1: 512)")
    parser.add_argument("--grid", choices=sorted(GRIDS), help="a named grid instead of --pe (see above)")
    parser.add_argument("--out", default="configs/generated", help="where the run YAMLs go")
    parser.add_argument("--runs-dir", default="runs", help="parent of each run's checkpoints/ and logs/")
    args = parser.parse_args(argv)
    variants, defaults = GRIDS[args.grid] if args.grid else ({pe: (pe, {}) for pe in args.pe}, PAPER_GRID)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    model_file = f"configs/models/{args.model}.yml"
    needed = [model_file] + sorted({f"configs/pe/{pe}.yml" for pe, _ in variants.values()})
    needed += [f"configs/data/{d}.yml" for d in args.data]
    missing = [path for path in needed if not (REPO / path).is_file()]
    if missing:
        print(f"generate_ymls.py: error: missing config files: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    commands = []
    for data in args.data:
        for variant, (pe, keys) in variants.items():
            for length in args.lengths:
                for seed in args.seeds:
                    name = run_name(args.model, variant, data, length, seed)
                    path = out / data / variant / f"{name}.yml"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    header = f"# generated by tools/generate_ymls.py: {name}\n"
                    settings = {**keys, **run_config(name, length, seed, args.runs_dir)}
                    path.write_text(header + yaml.safe_dump(settings, sort_keys=False))
                    commands.append(
                        f"python deepy.py train.py {model_file} configs/pe/{pe}.yml configs/data/{data}.yml {path}"
                    )
    script = out / "run_all.sh"
    script.write_text("#!/bin/sh\nset -e\n" + "\n".join(commands) + "\n")
    script.chmod(0o755)
    print(f"wrote {len(commands)} run configs under {out} and {script}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
