"""Load a trained run: its config, its weights, the device, the lengths asked for.

``evaluate.py``, ``generate.py``, ``analyze.py``, the demos and the benchmarks read a run the same
way:

* :func:`run_config` — the config of ``<ymls> [key=value ...]``; with no YAML file, the run's own
  ``configs/`` folder from the checkpoint ``--load`` names. It is a config for *using* a model:
  ``train_iters`` is 0 (as the reference's evaluation-only runs, docs/reference-format.md §5), so
  validation allows kernels without a CPU backward, and this is not logged or recorded as a user
  override.
* :func:`load_run` — the model of the config's family with the weights of a kerple, GPT-NeoX/KERPLE
  or Hugging Face checkpoint folder (the architecture checked field by field), in eval mode on a
  device.
* :func:`resolve_device` and :func:`parse_lengths` — the ``--device`` and length options, checked.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from kerple.config import load_config, parse_overrides, split_arguments
from kerple.config.neox_keys import normalize_key
from kerple.errors import KerpleError, quiet_log

USE_ONLY = {"train_iters": 0}
"""What :func:`run_config` fixes for a run that is used, not trained."""


class RunError(KerpleError):
    """A run that cannot be loaded as asked: no config, no checkpoint, or a device that is not there."""


@dataclass
class RunConfig:
    """A resolved config, with the YAML files and the user's overrides it came from (for records)."""

    cfg: Any
    yamls: list[str]
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadedRun:
    """A trained model ready to use: eval mode, on ``device``; ``folder`` and ``iteration`` it came from."""

    model: nn.Module
    folder: str
    iteration: int
    device: torch.device


def is_huggingface_export(folder: str | Path) -> bool:
    """Whether ``folder`` holds a Hugging Face export (``model.safetensors``)."""
    return (Path(folder) / "model.safetensors").is_file()


def run_config(
    words: Sequence[str],
    load: str | None = None,
    iteration: int | None = None,
    *,
    overrides: dict[str, Any] | None = None,
    quiet: bool = False,
) -> RunConfig:
    """The config of ``words`` (YAML files, then ``key=value`` overrides) plus ``overrides`` (the
    command's own flags, e.g. ``attention_impl``), for using a model (:data:`USE_ONLY`).

    With no YAML file the run's config comes from the checkpoint ``load``'s ``configs/`` folder;
    a Hugging Face export holds none, so its YAML files must be named. Raises :class:`RunError`.
    """
    yamls, override_words = split_arguments(words)
    if not yamls:
        yamls = _checkpoint_yamls(load, iteration)
        if not quiet:
            print(f"config: {', '.join(yamls)} (from the checkpoint)", file=sys.stderr)
    user = {k: v for k, v in parse_overrides(override_words).items() if normalize_key(k) not in USE_ONLY}
    user.update({k: v for k, v in (overrides or {}).items() if v is not None})
    with quiet_log() if quiet else contextlib.nullcontext():
        return RunConfig(load_config(yamls, user, fixed=USE_ONLY), yamls, user)


def _checkpoint_yamls(load: str | None, iteration: int | None) -> list[str]:
    from kerple.checkpoint.files import checkpoint_config_files

    if load is None:
        raise RunError("no config: name the run's YAML files, or pass --load DIR of a checkpoint with configs/")
    if is_huggingface_export(load):
        raise RunError(f"{load} is a Hugging Face export: name the run's YAML configs on the command line")
    return checkpoint_config_files(checkpoint_folder(None, load), iteration)


def checkpoint_folder(cfg: Any | None, load: str | None = None) -> str:
    """``load``, else the config's ``load``, else its ``save``; :class:`RunError` when it is not a folder."""
    folder = load or (None if cfg is None else cfg.checkpointing.load or cfg.checkpointing.save)
    if not folder:
        raise RunError("no checkpoint: pass --load DIR (or set load/save in the config)")
    if not Path(folder).is_dir():
        what = "is not a folder" if Path(folder).exists() else "does not exist"
        raise RunError(f"no checkpoint: --load {folder} {what}; pass --load DIR holding a trained run "
                       "(its 'latest' file and global_stepN/), or a Hugging Face export")
    return str(folder)


def load_weights(model: nn.Module, folder: str | Path, iteration: int | None, cfg: Any, *, trust: bool = False) -> int:
    """Load a checkpoint folder or a Hugging Face export into ``model`` after checking its
    architecture against ``cfg``; returns the checkpoint's iteration (an export's recorded one, else 0)."""
    from kerple.checkpoint import check_architecture, load_into_model, load_model_weights, state_architecture

    if is_huggingface_export(folder):
        from kerple.checkpoint.huggingface import exported_iteration, import_huggingface

        state, exported = import_huggingface(Path(folder))
        check_architecture(state_architecture(state, exported, exported.get("pos_emb")), cfg, folder)
        load_into_model(model, state, folder)
        return exported_iteration(folder) or 0
    return load_model_weights(model, folder, iteration, cfg=cfg, trust=trust)


def load_run(
    cfg: Any,
    load: str | None = None,
    iteration: int | None = None,
    *,
    trust: bool = False,
    device: torch.device | str = "cpu",
    flex_compile: bool = True,
    quiet: bool = False,
) -> LoadedRun:
    """Build ``cfg``'s model (its family's builder) and load the run's weights into it.

    ``load`` defaults to the config's ``load``, then ``save``. The model is in eval mode on ``device``.
    The run-time options the config does not set take the checkpoint's recorded
    values first (:func:`kerple.checkpoint.runtime_options.use_recorded`); ``cfg`` then holds them.
    """
    from kerple.checkpoint.runtime_options import USE, read_recorded, runtime_summary, use_recorded
    from kerple.model import build_model

    folder = checkpoint_folder(cfg, load)
    recorded = read_recorded(folder, iteration, trust=trust)
    notes = use_recorded(cfg, recorded, mode=USE)
    if recorded is not None and recorded.finetuned_from:
        notes.append(f"finetune: the weights are a fine-tune of {recorded.finetuned_from}")
    model = build_model(cfg, flex_compile=flex_compile)
    loaded = load_weights(model, folder, iteration, cfg, trust=trust)
    if not quiet:
        print(f"loaded {folder} at iteration {loaded}", file=sys.stderr)
        for line in filter(None, [runtime_summary(cfg), *notes]):
            print(f"run-time: {line}", file=sys.stderr)
    device = torch.device(device)
    return LoadedRun(model.to(device).eval(), folder, loaded, device)


def resolve_device(text: str | None, option: str = "--device") -> torch.device:
    """The device of ``--device`` (default: CUDA when available, else CPU), refused with one line
    when PyTorch does not know it or this machine does not have it."""
    if not text:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise RunError(f"{option} {text!r}: not a device PyTorch knows; use cpu or cuda (cuda:N for GPU N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RunError(f"{option} {text}: this PyTorch ({torch.__version__}) sees no CUDA GPU; use {option} cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RunError(f"{option} {text}: there are {torch.cuda.device_count()} CUDA GPU(s), numbered from 0")
    elif device.type != "cpu" and not _available(device.type):
        raise RunError(f"{option} {text}: no {device.type} device is available here; use cpu"
                       + (" or cuda" if torch.cuda.is_available() else ""))
    return device


def _available(device_type: str) -> bool:
    backend = getattr(torch, device_type, None) or getattr(torch.backends, device_type, None)
    is_available = getattr(backend, "is_available", None)
    return bool(is_available()) if callable(is_available) else False


def parse_lengths(text: str, option: str, minimum: int = 1) -> list[int]:
    """Comma-separated lengths of at least ``minimum``, sorted and unique; :class:`RunError` naming ``option``."""
    try:
        lengths = sorted({int(part) for part in str(text).split(",") if part.strip()})
    except ValueError:
        raise RunError(f"{option} {text!r}: expected comma-separated integers, e.g. 512,1024") from None
    if not lengths or lengths[0] < minimum:
        raise RunError(f"{option} {text!r}: expected lengths of at least {minimum} token{'s' if minimum > 1 else ''}")
    return lengths
