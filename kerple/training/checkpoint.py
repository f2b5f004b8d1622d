"""Checkpoints in the reference's pipeline layout (docs/reference-format.md §6), written atomically.

Layout under the ``save`` directory::

    latest                                          text: the tag of the newest complete checkpoint
    global_step<N>/layer_<II>-model_<MM>-model_states.pt   one per pipeline index II holding tensors
    global_step<N>/mp_rank_<MM>_model_states.pt     iteration, args, RNG, optimizer, scheduler, data
    global_step<N>/zero_pp_rank_<D>_mp_rank_<MM>_optim_states.pt   only for sharded optimizers
    global_step<N>/configs/<name>.yml               the resolved config of the run

Pipeline parallelism (``pipe_parallel_size: P``): each stage writes the layer files of the indices
it holds (together they are the same set as with ``P = 1``), so the weights load into a
non-pipeline model unchanged. Stage 0 writes ``mp_rank_<MM>_model_states.pt`` (the record
:mod:`kerple.checkpoint` reads the iteration and ``args`` from); stage ``S > 0`` writes its own
record, optimizer and RNG state under ``pipe_<SS>-mp_rank_<MM>_model_states.pt`` (and sharded
optimizers under ``zero_pp_rank_<D>_mp_rank_<MM>_pipe_<SS>_optim_states.pt``), names the
reference reader does not match.

Layer files hold exactly the model's ``sequential.<II>.`` keys with that prefix removed, so indices
1 and L+2 (parameter-free stages) have no file, as in the released KERPLE checkpoints.

Optimizer state: a plain ``torch.optim`` optimizer (fp32, ZeRO 0) and DeepSpeed's unpartitioned fp16
wrapper are stored under ``optimizer`` in ``mp_rank_MM_model_states.pt``, like the reference. Wrappers
that partition the fp32 master weights over data-parallel ranks (ZeRO 1/2/3, and DeepSpeed's bf16
optimizer) are stored one file per data-parallel rank in DeepSpeed's own file naming; resuming them
needs the same data-parallel size.

Atomicity: every rank writes into ``.tmp-global_step<N>``; after a barrier rank 0 renames it to
``global_step<N>`` and only then replaces ``latest`` (write-to-temp + ``os.replace``). A process
killed at any moment leaves ``latest`` pointing at a complete checkpoint; stale temporary
directories are removed by the next save.

Reading is not done here: weights of any checkpoint (this project's, GPT-NeoX's, KERPLE's, any
model-parallel size) are read by :mod:`kerple.checkpoint`, which never executes pickled code unless
trusted (its one allowlist includes DeepSpeed's loss-scaler classes). This module keeps what is
specific to writing and resuming this project's runs: atomic saves, ``latest``,
``keep_last_n_checkpoints``, and the optimizer / RNG / scheduler / data-position records.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from kerple.checkpoint import load_model_weights as _load_any_checkpoint
from kerple.checkpoint.errors import ArchitectureMismatchError, CheckpointError
from kerple.checkpoint.safe_load import safe_torch_load
from kerple.checkpoint.reference import LATEST_FILE
from kerple.checkpoint.sharding import split_key
from kerple.atomic import torch_save_atomic, write_text_atomic
from kerple.checkpoint.writer import FORMAT_VERSION

__all__ = [
    "ArchitectureMismatchError",
    "CheckpointError",
    "list_checkpoints",
    "load_model_weights",
    "prune_checkpoints",
    "resolve_checkpoint",
    "safe_load",
    "save_checkpoint",
]

TMP_PREFIX = ".tmp-"
TAG_PATTERN = re.compile(r"^global_step(\d+)$")


# --- names ---------------------------------------------------------------------------------------
def tag_for(iteration: int) -> str:
    return f"global_step{int(iteration)}"


def layer_file_name(index: int, mp_rank: int = 0) -> str:
    return f"layer_{index:02d}-model_{mp_rank:02d}-model_states.pt"


def mp_rank_file_name(mp_rank: int = 0, pipe_rank: int = 0) -> str:
    """The record of model-parallel rank ``mp_rank`` (of pipeline stage ``pipe_rank``)."""
    prefix = f"pipe_{pipe_rank:02d}-" if pipe_rank else ""
    return f"{prefix}mp_rank_{mp_rank:02d}_model_states.pt"


def optimizer_shard_file_name(dp_rank: int, mp_rank: int = 0, pipe_rank: int = 0) -> str:
    suffix = f"_pipe_{pipe_rank:02d}" if pipe_rank else ""
    return f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}{suffix}_optim_states.pt"


# --- state-dict <-> layer files ------------------------------------------------------------------
def split_by_layer(state_dict: dict[str, torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
    """Group ``sequential.<N>.<key>`` entries into ``{N: {key: tensor}}`` (tensors copied to CPU)."""
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in state_dict.items():
        index, key = split_key(name)
        # clone: saving a view would write the whole underlying storage
        layers.setdefault(index, {})[key] = tensor.detach().to("cpu", copy=True).contiguous()
    return dict(sorted(layers.items()))


# --- safe loading --------------------------------------------------------------------------------
def safe_load(path: Path, *, trust: bool = False) -> Any:
    """Read one checkpoint file on CPU without running pickled code (:func:`kerple.checkpoint.safe_torch_load`).

    The allowlist (DeepSpeed's loss-scaler records included) lives in :mod:`kerple.checkpoint.safe_load`.
    """
    return safe_torch_load(path, trust=trust)


# The per-file primitive; a module attribute so tests can substitute a failing writer.
_atomic_save = torch_save_atomic


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- locating checkpoints ------------------------------------------------------------------------
def list_checkpoints(directory: str | os.PathLike[str]) -> list[int]:
    """Iterations of the complete ``global_step<N>`` directories under ``directory``, ascending."""
    root = Path(directory)
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := TAG_PATTERN.match(p.name))]
    return sorted(steps)


def resolve_checkpoint(directory: str | os.PathLike[str], iteration: int | None = None) -> tuple[Path, int] | None:
    """The checkpoint directory and iteration to load: ``iteration`` if given, else ``latest``.

    Returns ``None`` when ``directory`` holds no checkpoint at all (a fresh run).
    """
    root = Path(directory)
    if iteration is not None:
        path = root / tag_for(iteration)
        if not path.is_dir():
            available = ", ".join(map(str, list_checkpoints(root))) or "none"
            raise CheckpointError(f"no checkpoint {path} (iterations available in {root}: {available})")
        return path, int(iteration)
    latest = root / LATEST_FILE
    if not latest.is_file():
        if list_checkpoints(root):
            raise CheckpointError(f"{root} has global_step directories but no '{LATEST_FILE}' file; pass the iteration")
        return None
    tag = latest.read_text().strip()
    match = TAG_PATTERN.match(tag)
    if match is None or not (root / tag).is_dir():
        raise CheckpointError(f"{latest} names {tag!r}, which is not a checkpoint directory in {root}")
    return root / tag, int(match.group(1))


# --- saving --------------------------------------------------------------------------------------
def save_checkpoint(
    save_dir: str | os.PathLike[str],
    *,
    iteration: int,
    module: nn.Module,
    optimizer: Any,
    model_state: dict[str, torch.Tensor] | None = None,
    client_state: dict[str, Any],
    parallel: Any,
    write_configs: Callable[[Path], None] | None = None,
    keep_last_n: int | None = None,
    before_commit: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``global_step<iteration>`` atomically (collective: every rank calls it).

    ``model_state`` replaces ``module.state_dict()`` where the caller gathered it (ZeRO-3: the
    full parameters, needed on data-parallel rank 0 only). ``client_state`` goes into
    ``mp_rank_MM_model_states.pt`` next to the optimizer state;
    ``write_configs(dir)`` writes the resolved config files into ``dir`` (rank 0);
    ``before_commit(tmp_dir)`` is a test hook run on rank 0 just before the rename.
    Raises :class:`CheckpointError` (on every rank) if any rank fails to write; the previous
    checkpoint and ``latest`` are then untouched.
    """
    root = Path(save_dir)
    tag = tag_for(iteration)
    tmp_dir = root / f"{TMP_PREFIX}{tag}"
    final_dir = root / tag
    mp_rank = parallel.model_parallel_rank
    dp_rank = parallel.data_parallel_rank
    pipe_rank = getattr(parallel, "pipe_parallel_rank", 0)
    sharded = is_sharded_optimizer(optimizer)

    if parallel.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp_dir.mkdir()
    parallel.barrier()

    error: BaseException | None = None
    try:
        if dp_rank == 0:
            weights = module.state_dict() if model_state is None else model_state
            for index, tensors in split_by_layer(weights).items():
                _atomic_save(tensors, tmp_dir / layer_file_name(index, mp_rank))
            state = dict(client_state)
            state.update(
                module=None,
                optimizer=None if sharded or optimizer is None else optimizer.state_dict(),
                optimizer_sharded=sharded,
                mp_world_size=parallel.model_parallel_size,
                dp_world_size=parallel.data_parallel_size,
                pipe_world_size=getattr(parallel, "pipe_parallel_size", 1),
                kerple_checkpoint_format=FORMAT_VERSION,
            )
            _atomic_save(state, tmp_dir / mp_rank_file_name(mp_rank, pipe_rank))
        if sharded:
            shard = {"optimizer_state_dict": optimizer.state_dict(), "ds_version": deepspeed_version()}
            _atomic_save(shard, tmp_dir / optimizer_shard_file_name(dp_rank, mp_rank, pipe_rank))
        if parallel.is_main and write_configs is not None:
            (tmp_dir / "configs").mkdir(exist_ok=True)
            write_configs(tmp_dir / "configs")
    except OSError as err:
        error = err
    failed = parallel.any_rank(error is not None)
    if failed:
        if parallel.is_main:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        reason = f": {error}" if error is not None else " on another rank"
        raise CheckpointError(
            f"saving checkpoint {final_dir} failed{reason}. Nothing was committed; "
            f"{root / LATEST_FILE} still names the previous checkpoint. Free disk space or change 'save'."
        ) from error

    if parallel.is_main:
        try:
            _commit(root, tmp_dir, final_dir, tag, before_commit)
            if keep_last_n:
                prune_checkpoints(root, keep_last_n)
        except OSError as err:
            error = err
    if parallel.any_rank(error is not None):
        raise CheckpointError(f"committing checkpoint {final_dir} failed: {error}") from error
    return final_dir


def _commit(root: Path, tmp_dir: Path, final_dir: Path, tag: str, before_commit: Callable[[Path], None] | None) -> None:
    _fsync_dir(tmp_dir)
    if before_commit is not None:
        before_commit(tmp_dir)
    if final_dir.exists():  # saving the same iteration again: replace it
        retired = root / f"{TMP_PREFIX}old-{tag}"
        os.replace(final_dir, retired)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(tmp_dir, final_dir)
    _fsync_dir(root)
    write_text_atomic(root / LATEST_FILE, tag)
    _fsync_dir(root)


def prune_checkpoints(directory: str | os.PathLike[str], keep_last_n: int) -> list[int]:
    """Delete all but the newest ``keep_last_n`` checkpoints (never the one ``latest`` names)."""
    root = Path(directory)
    steps = list_checkpoints(root)
    resolved = resolve_checkpoint(root)
    protected = resolved[1] if resolved else None
    removed = []
    for step in steps[: max(len(steps) - int(keep_last_n), 0)]:
        if step == protected:
            continue
        shutil.rmtree(root / tag_for(step), ignore_errors=True)
        removed.append(step)
    return removed


def is_sharded_optimizer(optimizer: Any) -> bool:
    """True for DeepSpeed wrappers whose fp32 master state is partitioned over data-parallel ranks."""
    return optimizer is not None and hasattr(optimizer, "partition_count")


def deepspeed_version() -> str:
    try:
        import deepspeed

        return str(deepspeed.__version__)
    except ImportError:
        return "unknown"


# --- loading ------------------------------------------------------------------------------------
def load_model_weights(
    model: nn.Module,
    load_dir: str | os.PathLike[str],
    iteration: int | None = None,
    *,
    cfg: Any = None,
    trust: bool = False,
) -> int:
    """Load the weights of any checkpoint (this project's, GPT-NeoX's, KERPLE's) into a one-rank ``model``.

    ``load_dir`` is the ``save`` directory (``latest`` or ``iteration`` picks the tag) or a tag
    directory; model-parallel checkpoints are merged. ``cfg`` enables the architecture check and
    ``trust`` the unsafe-pickle opt-in (``--trust-checkpoint``). Returns the iteration. Thin wrapper
    of :func:`kerple.checkpoint.load_model_weights`, kept for the evaluation code's positional calls.
    """
    return _load_any_checkpoint(model, load_dir, iteration, cfg=cfg, trust=trust)
