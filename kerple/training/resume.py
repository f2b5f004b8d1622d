"""Resuming a run from ``checkpointing.load``: weights first, the rest of the run state after.

Order matters for exactness: :func:`load_weights` runs before ``deepspeed.initialize`` so that the
fp32 master copies DeepSpeed makes (bf16, ZeRO) start from the checkpoint; :func:`restore_run_state`
runs after it, on the engine's optimizer.

Weights of any checkpoint are read by :mod:`kerple.checkpoint` (merged over the saved
model-parallel ranks, re-split to this run's) and checked against the config. Optimizer state is
resumed only from this project's format saved with this run's model- and pipeline-parallel sizes;
a GPT-NeoX / KERPLE reference checkpoint gives weights and the iteration, with a fresh optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from kerple.checkpoint import RunState, find_checkpoint, load_model_weights, restore_rng
from kerple.checkpoint.errors import ArchitectureMismatchError, CheckpointError
from kerple.checkpoint.runtime_options import NEW_RUN, RESUME, Recorded, finetuned_from, read_recorded, use_recorded
from kerple.checkpoint.run_state import read_optimizer_shards, read_run_state
from kerple.training.errors import TrainingError


@dataclass
class RunTimeOptions:
    """What :func:`prepare_resume` settled: lines for the banner, and the run this one's weights
    came from as a fine-tune (recorded in every checkpoint it writes)."""

    notes: list[str]
    finetuned_from: str | None


def prepare_resume(cfg: Any, *, trust: bool = False) -> RunTimeOptions:
    """Before the model is built, settle the run-time options (:mod:`kerple.checkpoint.runtime_options`)
    with the checkpoint in ``load``: a resume takes the recorded ones the config does not set and
    refuses different ones; a fine-tune (a new run) keeps the config's and notes the difference.

    Re-running a fine-tune's command (``finetune``, ``load`` the base run, ``save`` a folder that
    already holds this fine-tune's checkpoints) continues the fine-tune from ``save`` instead of
    starting it over and overwriting them; a ``save`` holding any other run is refused.
    """
    ck = cfg.checkpointing
    if not ck.load:
        return RunTimeOptions([], None)
    if not ck.finetune:
        recorded = _recorded(ck.load, trust)
        return RunTimeOptions(use_recorded(cfg, recorded, mode=RESUME), recorded and recorded.finetuned_from)
    origin = finetuned_from(cfg)
    if ck.save and Path(ck.save).resolve() != Path(ck.load).resolve() and _holds_checkpoint(ck.save):
        recorded = _recorded(ck.save, trust)
        if recorded is None or recorded.finetuned_from != origin:
            what = (f"recorded as a fine-tune of {recorded.finetuned_from}" if recorded and recorded.finetuned_from
                    else "not recorded as a fine-tune")
            raise TrainingError(
                f"save: {ck.save} ({cfg.source('save')}) already holds {find_checkpoint(ck.save)} ({what}), not a "
                f"fine-tune of load: {ck.load}. To continue that run, set load={ck.save} and remove finetune; to "
                "fine-tune anew, choose an empty save folder"
            )
        notes = use_recorded(cfg, recorded, mode=RESUME)
        ck.load, ck.finetune = ck.save, False  # the fine-tune in progress: its step count, optimizer, schedule
        return RunTimeOptions([f"continuing the fine-tune of {origin} that {recorded.where} holds", *notes], origin)
    return RunTimeOptions(use_recorded(cfg, _recorded(ck.load, trust), mode=NEW_RUN), origin)


def _holds_checkpoint(folder: str) -> bool:
    try:
        return find_checkpoint(folder) is not None
    except CheckpointError:
        return False  # load_weights reports it where it matters


def _recorded(folder: str, trust: bool) -> Recorded | None:
    try:
        return read_recorded(folder, trust=trust)
    except CheckpointError:
        return None  # load_weights reads the same files and reports what is wrong


@dataclass
class Resumed:
    """A checkpoint whose weights were loaded, and this rank's run state in it."""

    directory: Path
    state: RunState


def load_weights(model: nn.Module, cfg: Any, parallel: Any, *, trust: bool = False) -> Resumed | None:
    """Load the weights of the checkpoint in ``checkpointing.load`` into ``model`` (``None``: fresh run)."""
    load = cfg.checkpointing.load
    if not load:
        return None
    directory = find_checkpoint(load)
    if directory is None:
        save = cfg.checkpointing.save
        if not save or Path(load).resolve() != Path(save).resolve():
            state = "does not exist" if not Path(load).exists() else "holds no checkpoint"
            same = f"set load={save} (the save folder) to start fresh there and resume later, " if save else ""
            raise TrainingError(
                f"load: {load} ({cfg.source('load')}) {state}. Starting fresh is only automatic when load equals "
                f"save (resume-or-start): {same}fix the path, or remove 'load' to train from scratch"
            )
        parallel.barrier()
        return None
    try:
        iteration = load_model_weights(
            model,
            directory,
            cfg=cfg,
            trust=trust,
            model_parallel_size=parallel.model_parallel_size,
            model_parallel_rank=parallel.model_parallel_rank,
        )
    except ArchitectureMismatchError as error:
        save = cfg.checkpointing.save
        if not save or Path(load).resolve() == Path(save).resolve():
            raise
        # `save=` a new folder while a YAML's `load` still names an old run: the old run's config would
        # continue that run, which is not what a new folder asks for
        raise TrainingError(
            f"load: {load} ({cfg.source('load')}) is another run than save: {save} ({cfg.source('save')}), "
            f"and its model differs ({', '.join(error.fields)}). To start a new run in {save}, set load={save} too "
            f"(resume-or-start); to continue {load} instead, use its config ({directory}/configs)"
        ) from None
    return Resumed(directory, read_run_state(directory, parallel, iteration, trust=trust))


def restore_run_state(
    resumed: Resumed, *, engine: Any, scheduler: Any, cfg: Any, parallel: Any, global_batch: int, trust: bool = False
) -> tuple[int, int, int]:
    """Restore optimizer, LR schedule, RNG and the engine's counters as ``checkpointing`` allows.

    Returns ``(iteration, consumed samples, skipped steps)``; all zero for ``finetune`` (weights only).
    """
    ck, state = cfg.checkpointing, resumed.state
    if ck.finetune:
        return 0, 0, 0
    iteration = state.iteration
    consumed = iteration * global_batch if state.consumed_train_samples is None else int(state.consumed_train_samples)
    resumable = state.optimizer_resumable(parallel.model_parallel_size, parallel.pipe_parallel_size)
    if resumable and not ck.no_load_optim:
        if state.optimizer is None and not state.optimizer_sharded and parallel.is_main:
            schedule = ", the learning rate follows the config's schedule" if state.lr_scheduler is None else ""
            print(f"note: {resumed.directory} holds no optimizer state (a converted checkpoint, or one saved with "
                  f"no_save_optim); weights and iteration loaded, optimizer state starts fresh{schedule}", flush=True)
        _restore_optimizer(engine, state, resumed.directory, parallel, trust)
    elif not resumable and parallel.is_main:
        kind = "a model- or pipeline-parallel size other than this run's" if state.is_own_format else "the reference format"
        print(f"note: {resumed.directory} is in {kind}; weights and iteration loaded, optimizer state starts fresh", flush=True)
    # evaluation only (train_iters: 0, the reference's evaluation recipe) or a finished run takes no
    # step, so the checkpoint's schedule has nothing to disagree with
    trains = cfg.training.train_iters > iteration
    if state.lr_scheduler is not None and not ck.no_load_optim and trains:
        scheduler.load_state_dict(state.lr_scheduler)
    else:
        scheduler.step(iteration)
    if state.is_own_format and not ck.no_load_rng:
        restore_rng(state.rng)
    engine.global_steps, engine.global_samples, engine.skipped_steps = iteration, consumed, state.skipped_steps
    return iteration, consumed, state.skipped_steps


def _restore_optimizer(engine: Any, state: RunState, directory: Path, parallel: Any, trust: bool) -> None:
    optimizer = engine.optimizer
    if not state.optimizer_sharded:
        if state.optimizer is not None:
            optimizer.load_state_dict(state.optimizer)
        return
    shards = read_optimizer_shards(directory, state, parallel, trust=trust)
    zero3 = engine.zero_optimization_partition_weights()
    if zero3:  # DeepSpeed's own loader partitions every parameter first, then restores
        optimizer.checkpoint_event_prologue()
    optimizer.load_state_dict(shards, load_optimizer_states=True, load_from_fp32_weights=True)
    if zero3:
        optimizer.checkpoint_event_epilogue()
