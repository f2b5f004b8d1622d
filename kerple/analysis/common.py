"""What every ``analyze.py`` subcommand shares: the run loading of :mod:`kerple.runs` (as
``evaluate.py``), lengths, temperatures, held-out token windows, atomic outputs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerple.analysis.errors import AnalysisError
from kerple.atomic import write_json_atomic
from kerple.cli import add_config_arguments
from kerple.evaluation.errors import EvaluationError
from kerple.evaluation.temperature import temperature_for
from kerple.runs import load_run, resolve_device, run_config
from kerple.runs import parse_lengths as parse_run_lengths

ANALYSIS_FORMAT = "kerple-analysis-1"


def add_model_arguments(parser: argparse.ArgumentParser, *, load_required: bool = True) -> None:
    """``<ymls> [key=value ...] --load DIR [--iteration N]`` as in ``evaluate.py``, plus device and progress."""
    add_config_arguments(parser, "no YAML: the run's own, from the configs/ folder of the first --load")
    parser.add_argument("--load", action="append",
                        help="checkpoint directory (default: the config's load, else save)"
                        + ("; repeat it to compare runs" if load_required else ""))
    parser.add_argument("--iteration", type=int, help="checkpoint iteration (default: the 'latest' tag)")
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="allow arbitrary pickled objects in the checkpoint (only for files you trust)")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of sampled windows, prompts and inits")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_of(args: argparse.Namespace, load: str | None = None, *, quiet: bool = False, **overrides: Any) -> Any:
    """The analysis config of a subcommand's ``<ymls> key=value ... --load DIR``
    (:func:`kerple.runs.run_config`); with no YAML file, the run's own config from the ``configs/``
    of checkpoint ``load`` (default: the first ``--load``)."""
    load = load or (args.load or [None])[0]
    return run_config(args.configs, load, args.iteration, overrides=overrides, quiet=quiet).cfg


def load_model(cfg: Any, load: str | None, args: argparse.Namespace) -> tuple[torch.nn.Module, str, int]:
    """The trained model of ``cfg`` from ``load`` in eval mode on ``args.device`` (:func:`kerple.runs.load_run`)."""
    run = load_run(cfg, load, args.iteration, trust=args.trust_checkpoint, device=device_of(args))
    return run.model, run.folder, run.iteration


def device_of(args: argparse.Namespace) -> torch.device:
    """``--device``, checked (:func:`kerple.runs.resolve_device`)."""
    return resolve_device(args.device)


def parse_lengths(text: str, option: str = "--lengths") -> list[int]:
    """Comma-separated lengths of at least 2 tokens (one to predict from), sorted and unique."""
    return parse_run_lengths(text, option, minimum=2)


def check_lengths(cfg: Any, lengths: list[int]) -> None:
    """Refuse lengths beyond a learned absolute table (``max_position_embeddings`` rows)."""
    cfg.check_eval_length(max(lengths))


def temperature_at(text: str | None, length: int, train_length: int, option: str = "--temperature") -> float:
    """The softmax temperature τ of ``option`` at ``length``: a number in (0, 1] (1 = the trained
    model, thesis §5.4) or ``log`` = ``log_L(L_tr)`` beyond the train length (thesis §5.5)."""
    return 1.0 if text is None else temperature_for(str(text), length, train_length, option)


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
