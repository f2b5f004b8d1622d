"""What every ``analyze.py`` subcommand shares: config and checkpoint loading with
``evaluate.py``'s conventions, lengths, temperatures, held-out token windows, atomic outputs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerple.analysis.errors import AnalysisError
from kerple.atomic import write_json_atomic
from kerple.config import load_config, parse_overrides, split_arguments
from kerple.config.neox_keys import normalize_key
from kerple.evaluation.errors import EvaluationError

ANALYSIS_FORMAT = "kerple-analysis-1"


def add_model_arguments(parser: argparse.ArgumentParser, *, load_required: bool = True) -> None:
    """``<ymls> [key=value ...] --load DIR [--iteration N]`` as in ``evaluate.py``, plus device and progress."""
    parser.add_argument("configs", nargs="*",
                        help="YAML config files merged in order, then key=value overrides "
                             "(no YAML: the run's config from the first --load's checkpoint configs/)")
    parser.add_argument("--load", action="append",
                        help="checkpoint directory (default: the config's load, else save)"
                        + ("; repeat it to compare runs" if load_required else ""))
    parser.add_argument("--iteration", type=int, help="checkpoint iteration (default: the 'latest' tag)")
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="allow arbitrary pickled objects in the checkpoint (only for files you trust)")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of sampled windows, prompts and inits")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def analysis_config(words: list[str], **overrides: Any) -> Any:
    """The config of ``<ymls> key=value ...`` for analysis only (``train_iters: 0``, as evaluate.py)."""
    yamls, override_words = split_arguments(words)
    merged = {k: v for k, v in parse_overrides(override_words).items() if normalize_key(k) != "train_iters"}
    merged.update({"train_iters": 0, **{k: v for k, v in overrides.items() if v is not None}})
    return load_config(yamls, merged)


def config_of(args: argparse.Namespace, load: str | None = None, **overrides: Any) -> Any:
    """The analysis config of a subcommand's ``<ymls> key=value ... --load DIR``; with no YAML file,
    the run's own config from the ``configs/`` of checkpoint ``load`` (default: the first
    ``--load``), as ``evaluate.py`` does."""
    from kerple.checkpoint.files import checkpoint_config_files

    yamls, _ = split_arguments(args.configs)
    words = list(args.configs)
    if not yamls:
        load = load or (args.load or [None])[0]
        if load is None:
            raise AnalysisError("no config: name the run's YAML files, or pass --load DIR of a checkpoint with configs/")
        if not Path(load).is_dir():
            raise AnalysisError(f"no checkpoint: --load {load} is not a folder; pass --load DIR holding a trained run")
        files = checkpoint_config_files(load, args.iteration)
        print(f"config: {', '.join(files)} (from the checkpoint)", file=sys.stderr)
        words = [*files, *words]
    return analysis_config(words, **overrides)


def checkpoint_folder(cfg: Any, load: str | None) -> str:
    """``load``, else the config's ``load``/``save``; refuses (``AnalysisError``) when it is not a folder."""
    folder = load or cfg.checkpointing.load or cfg.checkpointing.save
    if not folder or not Path(folder).is_dir():
        raise AnalysisError(f"no checkpoint: {'--load ' + str(folder) if folder else '--load'} is not a folder; "
                            "pass --load DIR holding a trained run (its 'latest' file and global_stepN/)")
    return str(folder)


def load_model(cfg: Any, load: str | None, args: argparse.Namespace) -> tuple[torch.nn.Module, str, int]:
    """The trained model of ``cfg`` from ``load`` in eval mode on ``args.device``; refuses a missing checkpoint."""
    from kerple.evaluation.cli import load_trained_model

    model, folder, iteration = load_trained_model(cfg, checkpoint_folder(cfg, load), args.iteration,
                                                  trust=args.trust_checkpoint)
    return model.to(device_of(args)).eval(), folder, iteration


def device_of(args: argparse.Namespace) -> torch.device:
    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def parse_lengths(text: str, option: str = "--lengths") -> list[int]:
    """Comma-separated positive lengths, sorted and unique."""
    try:
        lengths = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise AnalysisError(f"{option} {text!r}: expected comma-separated integers, e.g. 64,512") from None
    if not lengths or lengths[0] < 2:
        raise AnalysisError(f"{option} {text!r}: expected lengths of at least 2 tokens")
    return lengths


def check_lengths(cfg: Any, lengths: list[int]) -> None:
    """Refuse lengths beyond a learned absolute table (``max_position_embeddings`` rows)."""
    cfg.check_eval_length(max(lengths))


def temperature_at(text: str | None, length: int, train_length: int, option: str = "--temperature") -> float:
    """The softmax temperature τ of ``option`` at ``length``: a number in (0, 1] (1 = the trained
    model, thesis §5.4) or ``log`` = ``log_L(L_tr)`` beyond the train length (thesis §5.5)."""
    if text is None:
        return 1.0
    from kerple.evaluation.cli import temperature_for

    try:
        return temperature_for(str(text), length, train_length)
    except EvaluationError as error:
        raise AnalysisError(str(error).replace("--softmax-temperature", option)) from None


def sample_windows(cfg: Any, length: int, count: int, seed: int, split: str = "valid") -> torch.Tensor:
    """``count`` windows of ``length`` held-out tokens ``[count, length]`` at seeded random offsets."""
    from kerple.evaluation.runner import load_split_stream

    try:
        stream = load_split_stream(cfg, split)
    except EvaluationError as error:
        raise AnalysisError(str(error)) from None
    if len(stream) < length + 1:
        raise AnalysisError(f"the {split} split holds {len(stream)} tokens, fewer than one window of {length}")
    starts = np.random.default_rng(seed).integers(0, len(stream) - length, size=count)
    return torch.from_numpy(np.stack([stream[s : s + length] for s in starts]).astype(np.int64))


def write_json(path: str | Path, doc: dict[str, Any]) -> Path:
    """The result document with its format tag, written atomically."""
    return write_json_atomic(path, {"format": ANALYSIS_FORMAT, **doc})


def save_figure(figure: Any, path: str | Path) -> Path:
    """A matplotlib figure as PNG, written atomically; the figure is closed."""
    from kerple.evaluation.plots import save_figure as save_png

    return save_png(figure, path, dpi=110)


def png_beside(output: str | Path, plot: str | None) -> Path:
    """The plot's path: ``--plot`` when given, else the JSON output with a ``.png`` suffix."""
    return Path(plot) if plot else Path(output).with_suffix(".png")


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
