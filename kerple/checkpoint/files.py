"""Checkpoint file names, finding the checkpoint to read, and pruning old ones (docs/reference-format.md §6).

Layout under a ``save`` directory::

    latest                                                  text: the tag of the newest complete checkpoint
    global_step<N>/layer_<II>-model_<MM>-model_states.pt    one per pipeline index II holding tensors
    global_step<N>/mp_rank_<MM>_model_states.pt             iteration, args, RNG, optimizer, scheduler, data
    global_step<N>/zero_pp_rank_<D>_mp_rank_<MM>_optim_states.pt   only for sharded optimizers
    global_step<N>/configs/<name>.yml                       the run's config files

Pipeline stage ``S > 0`` of this project's runs writes its record as
``pipe_<SS>-mp_rank_<MM>_model_states.pt`` (and sharded optimizers as
``zero_pp_rank_<D>_mp_rank_<MM>_pipe_<SS>_optim_states.pt``), names the reference reader does not
match. Every name is built here.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from kerple.checkpoint.errors import CheckpointError

LATEST_FILE = "latest"
PRUNING_PREFIX = ".pruning-"
TMP_PREFIX = ".tmp-"
TAG = re.compile(r"^global_step(\d+)$")
LAYER_FILE = re.compile(r"^layer_(\d+)-model_(\d+)-model_states\.pt$")
MP_FILE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_TRAILING_STEP = re.compile(r"(\d+)$")


def plain_args(args: Any) -> dict[str, Any]:
    """A record's ``args`` as a dict: GPT-NeoX stores a dict, Megatron-style records an
    ``argparse.Namespace`` (docs/reference-format.md §6); anything else gives ``{}``."""
    if isinstance(args, dict):
        return dict(args)
    if args is not None and hasattr(args, "__dict__"):
        return dict(vars(args))
    return {}


def tag_for(iteration: int) -> str:
    """``global_step<iteration>``."""
    return f"global_step{int(iteration)}"


def layer_file_name(index: int, mp_rank: int = 0) -> str:
    """The file of pipeline index ``index`` on model-parallel rank ``mp_rank``."""
    return f"layer_{index:02d}-model_{mp_rank:02d}-model_states.pt"


def mp_rank_file_name(mp_rank: int = 0, pipe_rank: int = 0) -> str:
    """The record of model-parallel rank ``mp_rank`` (of pipeline stage ``pipe_rank``)."""
    prefix = f"pipe_{pipe_rank:02d}-" if pipe_rank else ""
    return f"{prefix}mp_rank_{mp_rank:02d}_model_states.pt"


def optimizer_shard_file_name(dp_rank: int, mp_rank: int = 0, pipe_rank: int = 0) -> str:
    """DeepSpeed's name for the optimizer shard of data-parallel rank ``dp_rank``."""
    suffix = f"_pipe_{pipe_rank:02d}" if pipe_rank else ""
    return f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}{suffix}_optim_states.pt"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[int]:
    """Iterations of the ``global_step<N>`` directories under ``directory``, ascending."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := TAG.match(p.name)))


def trailing_step(name: str) -> int | None:
    """The iteration a tag directory's name ends with (``global_step50`` -> 50), if any."""
    match = _TRAILING_STEP.search(name)
    return None if match is None else int(match.group(1))


def holds_checkpoint_files(path: Path) -> bool:
    """Whether ``path`` is itself a tag directory (it holds layer or ``mp_rank`` files)."""
    return path.is_dir() and any(LAYER_FILE.match(p.name) or MP_FILE.match(p.name) for p in path.iterdir())


def latest_tag(directory: str | os.PathLike[str]) -> str | None:
    """The tag the ``latest`` file of ``directory`` names, or ``None`` when there is no such file.

    The tag must be one folder name inside ``directory`` (``global_step100``): a ``latest`` that
    is not UTF-8 text, names a path (absolute, with ``..`` or a separator, which would read a
    checkpoint from elsewhere) or names no folder is a :class:`CheckpointError`."""
    root = Path(directory)
    latest = root / LATEST_FILE
    if not latest.is_file():
        return None
    def refuse(problem: str) -> CheckpointError:  # the folder is listed only when the tag is refused
        available = ", ".join(map(str, list_checkpoints(root))) or "none"
        return CheckpointError(f"{problem}; write the tag of one of its checkpoints into it (iterations in {root}: "
                               f"{available}), or load a checkpoint folder itself ({root / 'global_stepN'}, or "
                               "--iteration N)")

    try:
        tag = latest.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        raise refuse(f"{latest}: not a text file naming a checkpoint folder (its bytes are not UTF-8)") from None
    except OSError as error:
        raise refuse(f"{latest}: cannot read ({error.strerror})") from None
    if not tag or tag in (".", "..") or Path(tag).name != tag or "\\" in tag or "\n" in tag or "\0" in tag:
        raise refuse(f"{latest} names {tag[:200]!r}, not a checkpoint folder name: it must be one folder "
                     f"inside {root} (like global_step100), not a path")
    if not (root / tag).is_dir():
        raise refuse(f"{latest} names {tag!r}, which is not a checkpoint directory in {root}")
    return tag


def find_checkpoint(directory: str | os.PathLike[str], iteration: int | None = None) -> Path | None:
    """The tag directory to read from ``directory``, or ``None`` when it holds no checkpoint at all.

    ``directory`` is a ``save`` folder (``iteration`` picks ``global_step<iteration>``, else
    ``latest`` names the tag) or a tag directory itself. Raises :class:`CheckpointError` when the
    iteration asked for is missing, ``latest`` names no directory, or there are tags but no ``latest``.
    """
    root = Path(directory)
    if not root.is_dir():
        return None
    if iteration is not None:
        candidate = root / tag_for(iteration)
        if candidate.is_dir():
            return candidate
        if holds_checkpoint_files(root) and trailing_step(root.name) == iteration:
            return root
        available = ", ".join(map(str, list_checkpoints(root))) or "none"
        raise CheckpointError(f"no checkpoint {candidate} (iterations available in {root}: {available})")
    tag = latest_tag(root)
    if tag is not None:
        return root / tag
    if holds_checkpoint_files(root):
        return root
    if list_checkpoints(root):
        raise CheckpointError(f"{root} has global_step directories but no '{LATEST_FILE}' file; pass the iteration")
    return None


def checkpoint_to_read(directory: str | os.PathLike[str], iteration: int | None = None) -> Path:
    """:func:`find_checkpoint`, with a :class:`CheckpointError` where there is nothing to read."""
    found = find_checkpoint(directory, iteration)
    if found is not None:
        return found
    if not Path(directory).is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist; name the save folder of a trained run")
    raise CheckpointError(f"{directory} has no '{LATEST_FILE}' file and no checkpoint files: it holds no trained run; "
                          "name the save folder of one (its 'latest' file and global_stepN/)")


def prune_checkpoints(directory: str | os.PathLike[str], keep_last_n: int) -> list[int]:
    """Delete all but the newest ``keep_last_n`` checkpoints (never the one ``latest`` names).

    Each folder is first renamed to ``.pruning-<tag>`` (one atomic step), then deleted, so a kill
    mid-delete never leaves a half-deleted ``global_step<N>`` that still counts as a checkpoint;
    leftovers of such a kill are deleted by the next prune.
    """
    root = Path(directory)
    steps = list_checkpoints(root)
    protected = find_checkpoint(root)
    removed = []
    for step in steps[: max(len(steps) - int(keep_last_n), 0)]:
        if protected is not None and protected.name == tag_for(step):
            continue
        os.replace(root / tag_for(step), root / f"{PRUNING_PREFIX}{tag_for(step)}")
        removed.append(step)
    for leftover in root.glob(f"{PRUNING_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return removed


RESOLVED_CONFIG = "resolved.yml"
"""The whole resolved config a kerple checkpoint stores beside the run's own files under ``configs/``."""


def checkpoint_config_files(directory: str | os.PathLike[str], iteration: int | None = None) -> list[str]:
    """The config files stored in a checkpoint's ``configs/`` folder, for commands run with
    ``--load DIR`` and no YAML: kerple's ``resolved.yml`` alone when present (it is the whole
    config), otherwise every ``*.yml``/``*.yaml`` sorted by name (GPT-NeoX writes the run's files there)."""
    tag_dir = checkpoint_to_read(directory, iteration)
    folder = tag_dir / "configs"
    resolved = folder / RESOLVED_CONFIG
    if resolved.is_file():
        return [str(resolved)]
    files = sorted(list(folder.glob("*.yml")) + list(folder.glob("*.yaml"))) if folder.is_dir() else []
    if not files:
        raise CheckpointError(
            f"{tag_dir} has no configs/ folder with YAML files: name the run's YAML configs on the command line"
        )
    return [str(path) for path in files]

