"""The one checkpoint writer: GPT-NeoX's layout (docs/reference-format.md §6), committed atomically.

Two callers share it. The trainer's :func:`save_checkpoint` is collective: every rank writes its own
files (its layer files, its ``mp_rank`` record, its optimizer shard) into one temporary tag
directory. The converter's :func:`write_checkpoint` writes every model-parallel rank of a full state
dict from one process, in the pipeline layout (layer files) or the sequential layout (the weights
under ``module`` in each ``mp_rank`` record).

Atomicity: files are written into ``.tmp-global_step<N>``; after every rank has written, the main
rank renames it to ``global_step<N>`` and only then replaces ``latest`` (write-to-temp +
``os.replace``). A process killed at any moment leaves ``latest`` naming a complete checkpoint;
stale temporary directories are removed by the next save into the same folder. A failed write on
any rank raises :class:`CheckpointError` on every rank and commits nothing.

Optimizer state: a plain ``torch.optim`` optimizer (fp32, ZeRO 0) and DeepSpeed's unpartitioned
fp16 wrapper are stored under ``optimizer`` in the ``mp_rank`` record, like the reference. Wrappers
that partition the fp32 master weights over data-parallel ranks (ZeRO 1/2/3, DeepSpeed's bf16
optimizer) are stored one file per data-parallel rank in DeepSpeed's own naming; resuming them
needs the same data-parallel size.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from kerple import atomic
from kerple.checkpoint.architecture import REFERENCE_ARGS
from kerple.checkpoint.errors import CheckpointError
from kerple.checkpoint.files import (
    LATEST_FILE,
    TMP_PREFIX,
    layer_file_name,
    mp_rank_file_name,
    optimizer_shard_file_name,
    prune_checkpoints,
    tag_for,
)
from kerple.checkpoint.neox_layout import WORD_EMBEDDINGS, NeoxAdapter, join_key
from kerple.checkpoint.run_state import FORMAT_KEY, FORMAT_VERSION, ParallelSizes, RunState, deepspeed_version
from kerple.checkpoint.sharding import ShardSpec, split_model_parallel


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


def _one_process() -> Any:
    """The ``parallel`` of a writer that runs alone (the converter)."""
    from kerple.parallel.groups import ParallelState

    return ParallelState(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")


@contextmanager
def _staged_tag(
    root: Path, tag: str, parallel: Any, before_commit: Callable[[Path], None] | None = None
) -> Iterator[Path]:
    """Yield the temporary directory every rank writes ``tag``'s files into; then commit it (collective).

    An ``OSError`` of the body on any rank discards the directory and raises :class:`CheckpointError`
    on every rank. ``before_commit(tmp_dir)`` runs on the main rank just before the rename.
    """
    tmp_dir, final_dir = root / f"{TMP_PREFIX}{tag}", root / tag
    if parallel.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp_dir.mkdir()
    parallel.barrier()
    error: OSError | None = None
    try:
        yield tmp_dir
    except OSError as err:
        error = err
    if parallel.any_rank(error is not None):
        if parallel.is_main:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        reason = f": {error}" if error is not None else " on another rank"
        latest = root / LATEST_FILE
        kept = (f"{latest} still names {latest.read_text().strip()}" if latest.is_file()
                else f"{root} holds no checkpoint of this run yet")
        raise CheckpointError(
            f"saving checkpoint {final_dir} failed{reason}. Nothing was committed and the partial files were "
            f"removed; {kept}. Free disk space or change the output folder, then run the same command again."
        ) from error
    if parallel.is_main:
        try:
            _commit(root, tmp_dir, final_dir, before_commit)
        except OSError as err:
            error = err
    if parallel.any_rank(error is not None):
        raise CheckpointError(f"committing checkpoint {final_dir} failed: {error}") from error


def _commit(root: Path, tmp_dir: Path, final_dir: Path, before_commit: Callable[[Path], None] | None) -> None:
    _fsync_dir(tmp_dir)
    if before_commit is not None:
        before_commit(tmp_dir)
    if final_dir.exists():  # saving the same iteration again: replace it
        retired = root / f"{TMP_PREFIX}old-{final_dir.name}"
        os.replace(final_dir, retired)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(tmp_dir, final_dir)
    _fsync_dir(root)
    atomic.write_text_atomic(root / LATEST_FILE, final_dir.name)
    _fsync_dir(root)


def _write_layer_files(directory: Path, state: dict[str, torch.Tensor], mp_rank: int) -> None:
    """One file per pipeline index of the checkpoint state dict ``state`` (``sequential.<N>.<key>``)."""
    for index, tensors in NeoxAdapter.for_reference(state).layer_files(state).items():
        atomic.torch_save_atomic(tensors, directory / layer_file_name(index, mp_rank))


def is_sharded_optimizer(optimizer: Any) -> bool:
    """True for DeepSpeed wrappers whose fp32 master state is partitioned over data-parallel ranks
    (ZeRO 1/2/3 and the bf16 optimizer all carry ``partition_count``; no common base class says it)."""
    return optimizer is not None and hasattr(optimizer, "partition_count")


def save_checkpoint(
    save_dir: str | os.PathLike[str],
    *,
    module: nn.Module,
    run_state: RunState,
    optimizer: Any,
    parallel: Any,
    model_state: dict[str, torch.Tensor] | None = None,
    write_configs: Callable[[Path], None] | None = None,
    keep_last_n: int | None = None,
    before_commit: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``global_step<run_state.iteration>`` of a training run (collective: every rank calls it).

    ``module`` is this rank's :class:`~kerple.model.GPTModel` (a tensor-parallel slice, or a pipeline
    stage); its state dict goes through :class:`NeoxAdapter`. ``model_state`` replaces
    ``module.state_dict()`` where the caller gathered it (ZeRO-3: the full parameters, needed on
    data-parallel rank 0 only). ``run_state`` becomes the ``mp_rank`` record, completed with the
    optimizer and the parallel sizes. ``write_configs(dir)`` writes the run's config files (main
    rank); ``keep_last_n`` prunes older checkpoints after the commit. Returns the tag directory.
    """
    root, tag = Path(save_dir), tag_for(run_state.iteration)
    mp_rank, pipe_rank = parallel.model_parallel_rank, parallel.pipe_parallel_rank
    sharded = is_sharded_optimizer(optimizer)
    with _staged_tag(root, tag, parallel, before_commit) as tmp_dir:
        if parallel.data_parallel_rank == 0:
            weights = module.state_dict() if model_state is None else model_state
            _write_layer_files(tmp_dir, NeoxAdapter.for_model(module).to_reference(weights), mp_rank)
            record = dataclasses.replace(
                run_state,
                optimizer=None if sharded or optimizer is None else optimizer.state_dict(),
                optimizer_sharded=sharded,
                sizes=ParallelSizes(parallel.model_parallel_size, parallel.data_parallel_size, parallel.pipe_parallel_size),
                format_version=FORMAT_VERSION,
            ).to_record()
            atomic.torch_save_atomic(record, tmp_dir / mp_rank_file_name(mp_rank, pipe_rank))
        if sharded:
            shard = {"optimizer_state_dict": optimizer.state_dict(), "ds_version": deepspeed_version()}
            atomic.torch_save_atomic(shard, tmp_dir / optimizer_shard_file_name(parallel.data_parallel_rank, mp_rank, pipe_rank))
        if parallel.is_main and write_configs is not None:
            (tmp_dir / "configs").mkdir(exist_ok=True)
            write_configs(tmp_dir / "configs")
    if parallel.is_main and keep_last_n:
        prune_checkpoints(root, keep_last_n)
    return root / tag


def write_checkpoint(
    out_dir: str | os.PathLike[str],
    state: dict[str, torch.Tensor],
    *,
    iteration: int,
    args: dict[str, Any],
    layout: str = "pipeline",
    model_parallel_size: int = 1,
    flavor: str = "kerple",
    config_files: dict[str, str] | None = None,
    output_layer_parallelism: str = "column",
) -> Path:
    """Write the full checkpoint state dict ``state`` (``sequential.<N>.<key>``; a model's state dict
    goes through :meth:`NeoxAdapter.to_reference` first) as ``out_dir/global_step<iteration>``.

    ``args`` must hold at least ``num_attention_heads``. Flavours: ``kerple`` (this project: every
    ``args`` field and the format marker) and ``neox`` (the reference's ``args`` fields only; the
    embedding is then named in ``configs/*.yml`` as the reference does). ``config_files`` (file name
    -> YAML text) are written under ``configs/``. Refuses to overwrite an existing tag directory.
    """
    if layout not in ("pipeline", "sequential"):
        raise CheckpointError(f"unknown layout {layout!r}; choose pipeline or sequential")
    if flavor not in ("kerple", "neox"):
        raise CheckpointError(f"unknown flavor {flavor!r}; choose kerple or neox")
    root, tag = Path(out_dir), tag_for(iteration)
    if (root / tag).exists():
        raise CheckpointError(f"{root / tag} already exists; choose another output directory")
    hidden = int(state[join_key(0, WORD_EMBEDDINGS)].shape[1])
    spec = ShardSpec(int(args["num_attention_heads"]), hidden, output_layer_parallelism)
    shards = split_model_parallel(state, model_parallel_size, spec)
    recorded = {**args, "model_parallel_size": model_parallel_size}
    if flavor == "neox":
        recorded = {key: recorded[key] for key in REFERENCE_ARGS if key in recorded}
    with _staged_tag(root, tag, _one_process()) as tmp_dir:
        for rank, shard in enumerate(shards):
            record: dict[str, Any] = {
                "iteration": int(iteration), "args": recorded, "mp_world_size": model_parallel_size,
                "module": None, "optimizer": None,
            }
            if flavor == "kerple":
                record[FORMAT_KEY] = FORMAT_VERSION
            if layout == "sequential":
                record["module"] = {name: tensor.detach().cpu().clone() for name, tensor in shard.items()}
            else:
                _write_layer_files(tmp_dir, shard, rank)
            atomic.torch_save_atomic(record, tmp_dir / mp_rank_file_name(rank))
        for name, text in (config_files or {}).items():
            atomic.write_text_atomic(tmp_dir / "configs" / name, text)
    return root / tag
