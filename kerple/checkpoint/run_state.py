"""The run state a checkpoint records besides the weights, as one typed record (docs/reference-format.md §6).

:class:`RunState` holds what resuming a run needs: iteration, consumed samples, skipped steps,
data position, LR-scheduler state, optimizer state (or where its shards are), RNG states, the
parallel sizes it was saved with and the architecture ``args``. On disk it is the
``mp_rank_MM_model_states.pt`` record with the reference's keys (:meth:`RunState.to_record`,
:meth:`RunState.from_record`).

RNG states are stored in a form ``torch.load(weights_only=True)`` accepts: NumPy's state tuple is
kept under the reference's key ``np_rng_state`` but as a dict of a tensor and plain numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerple.checkpoint.errors import CheckpointError
from kerple.checkpoint.files import mp_rank_file_name, optimizer_shard_file_name, plain_args
from kerple.checkpoint.safe_load import safe_torch_load

FORMAT_VERSION = 1
FORMAT_KEY = "kerple_checkpoint_format"
RNG_KEYS = ("random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state", "rng_tracker_states")


@dataclass(frozen=True)
class ParallelSizes:
    """The model-, data- and pipeline-parallel sizes a checkpoint was saved with."""

    model: int = 1
    data: int = 1
    pipe: int = 1


@dataclass
class RunState:
    """One rank's training state at a checkpoint.

    ``format_version`` is ``None`` for a record this project did not write (a GPT-NeoX / KERPLE
    checkpoint): only its iteration is then used. ``rng`` holds :func:`capture_rng`'s states, or is
    empty when they were not saved. ``optimizer`` is the optimizer's state dict, unless
    ``optimizer_sharded`` (then each data-parallel rank's shard is a file of its own).
    """

    iteration: int
    args: dict[str, Any] = field(default_factory=dict)
    consumed_train_samples: int | None = None
    skipped_steps: int = 0
    seed: int | None = None
    lr_scheduler: dict[str, Any] | None = None
    rng: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] | None = None
    optimizer_sharded: bool = False
    sizes: ParallelSizes = field(default_factory=ParallelSizes)
    ds_version: str = "unknown"
    format_version: int | None = FORMAT_VERSION

    def to_record(self) -> dict[str, Any]:
        """The ``mp_rank_MM_model_states.pt`` record (weights live in the layer files: ``module`` is None)."""
        consumed = self.consumed_train_samples
        return {
            "iteration": self.iteration,
            "args": self.args,
            "lr_scheduler": self.lr_scheduler,
            "global_steps": self.iteration,
            "global_samples": consumed,
            "consumed_train_samples": consumed,
            "data_position": {"consumed_train_samples": consumed, "seed": self.seed},
            "skipped_steps": self.skipped_steps,
            "ds_version": self.ds_version,
            **self.rng,
            "module": None,
            "optimizer": self.optimizer,
            "optimizer_sharded": self.optimizer_sharded,
            "mp_world_size": self.sizes.model,
            "dp_world_size": self.sizes.data,
            "pipe_world_size": self.sizes.pipe,
            FORMAT_KEY: self.format_version,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunState:
        """The state a record holds (absent entries take the defaults)."""
        position = record.get("data_position") or {}
        return cls(
            iteration=int(record.get("iteration", record.get("global_steps")) or 0),
            args=plain_args(record.get("args")),
            consumed_train_samples=record.get("consumed_train_samples"),
            skipped_steps=int(record.get("skipped_steps", 0)),
            seed=position.get("seed"),
            lr_scheduler=record.get("lr_scheduler"),
            rng={key: record[key] for key in RNG_KEYS if key in record},
            optimizer=record.get("optimizer"),
            optimizer_sharded=bool(record.get("optimizer_sharded", False)),
            sizes=ParallelSizes(
                int(record.get("mp_world_size", 1)), int(record.get("dp_world_size", 1)), int(record.get("pipe_world_size", 1))
            ),
            ds_version=str(record.get("ds_version", "unknown")),
            format_version=record.get(FORMAT_KEY),
        )

    @property
    def is_own_format(self) -> bool:
        """Whether this project wrote the record (so optimizer, schedule, RNG and data position apply)."""
        return self.format_version is not None

    def optimizer_resumable(self, model_parallel_size: int, pipe_parallel_size: int) -> bool:
        """This project's record, saved with these model- and pipeline-parallel sizes (its optimizer
        state then fits this rank's parameters)."""
        return self.is_own_format and (self.sizes.model, self.sizes.pipe) == (model_parallel_size, pipe_parallel_size)


def read_run_state(directory: Path, parallel: Any, iteration: int, *, trust: bool = False) -> RunState:
    """This rank's :class:`RunState` in the tag ``directory`` (of iteration ``iteration``).

    ``parallel`` is a :class:`kerple.parallel.groups.ParallelState`. A reference checkpoint gives only
    its iteration; one of this project's saved with another model- or pipeline-parallel size gives
    rank 0's record (its optimizer state does not fit this rank).
    """
    record = safe_torch_load(directory / mp_rank_file_name(0), trust=trust)
    state = RunState.from_record(record if isinstance(record, dict) else {})
    if not state.is_own_format:
        return RunState(iteration=iteration, format_version=None)
    ranks = (parallel.model_parallel_rank, parallel.pipe_parallel_rank)
    if state.optimizer_resumable(parallel.model_parallel_size, parallel.pipe_parallel_size) and ranks != (0, 0):
        state = RunState.from_record(safe_torch_load(directory / mp_rank_file_name(*ranks), trust=trust))
    return state


def read_optimizer_shards(directory: Path, state: RunState, parallel: Any, *, trust: bool = False) -> list[dict[str, Any]]:
    """Every data-parallel rank's optimizer shard of this rank's model-parallel rank and stage."""
    if state.sizes.data != parallel.data_parallel_size:
        raise CheckpointError(
            f"{directory} holds optimizer shards of {state.sizes.data} data-parallel ranks but this run has "
            f"{parallel.data_parallel_size}; resume with the same number of processes or set no_load_optim"
        )
    mp_rank, pipe_rank = parallel.model_parallel_rank, parallel.pipe_parallel_rank
    files = [directory / optimizer_shard_file_name(dp, mp_rank, pipe_rank) for dp in range(parallel.data_parallel_size)]
    return [safe_torch_load(path, trust=trust)["optimizer_state_dict"] for path in files]


def capture_rng() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA) generator states, under the reference's key names."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "random_rng_state": random.getstate(),
        "np_rng_state": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "rng_tracker_states": None,
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`; absent entries are left alone."""
    if state.get("random_rng_state") is not None:
        version, internal, gauss = state["random_rng_state"]
        random.setstate((version, tuple(internal), gauss))
    np_state = state.get("np_rng_state")
    if isinstance(np_state, dict):
        np.random.set_state(
            (
                np_state["name"],
                np_state["keys"].numpy().astype(np.uint32),
                np_state["pos"],
                np_state["has_gauss"],
                np_state["cached_gaussian"],
            )
        )
    if state.get("torch_rng_state") is not None:
        torch.set_rng_state(state["torch_rng_state"])
    if state.get("cuda_rng_state") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng_state"])


def deepspeed_version() -> str:
    """The installed DeepSpeed's version (recorded beside optimizer states)."""
    try:
        import deepspeed
    except ImportError:
        return "unknown"
    return str(deepspeed.__version__)
