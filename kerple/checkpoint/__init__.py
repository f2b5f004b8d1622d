"""Checkpoints: GPT-NeoX's layout, read, checked, converted and written safely, in one package.

Public API:

* :class:`NeoxAdapter` - the one state-dict adapter between a model's names and GPT-NeoX's
  ``sequential.<N>.<key>`` names (``kerple.checkpoint.neox_layout``);
* :func:`safe_torch_load` - ``torch.load`` that runs no code from the file (``trust`` opts out);
* :func:`find_checkpoint`, :func:`list_checkpoints`, :func:`prune_checkpoints` and the file names
  (``kerple.checkpoint.files``);
* :func:`read_checkpoint` -> :class:`LoadedCheckpoint` - any reference or kerple checkpoint
  directory (``latest`` / iteration, pipeline or sequential layout, any model-parallel size) as
  one full ``sequential.<N>.*`` state dict;
* :func:`architecture_args`, :func:`checkpoint_architecture`, :func:`check_architecture` - the
  ``args`` record and the one architecture check; :func:`load_into_model`,
  :func:`load_model_weights` - load into a :class:`kerple.model.GPTModel`;
* :class:`RunState` - the typed ``mp_rank`` record (iteration, samples, RNG, scheduler, optimizer);
* :func:`save_checkpoint` (a training run, collective) and :func:`write_checkpoint` (a state dict,
  any layout and model-parallel size) - the one writer, atomic;
* :func:`merge_model_parallel`, :func:`split_model_parallel`, :class:`ShardSpec` - Megatron
  tensor-parallel layouts;
* :func:`export_huggingface`, :func:`import_huggingface` - Hugging Face folders
  (``kerple.checkpoint.huggingface``).
"""

from kerple.checkpoint.architecture import (
    architecture_args,
    check_architecture,
    checkpoint_architecture,
    positional_option_names,
    state_architecture,
)
from kerple.checkpoint.errors import (
    ArchitectureMismatchError,
    CheckpointError,
    ModelParallelError,
    UnsafeCheckpointError,
)
from kerple.checkpoint.files import find_checkpoint, list_checkpoints, prune_checkpoints, tag_for
from kerple.checkpoint.loading import load_into_model, load_model_weights
from kerple.checkpoint.neox_layout import NeoxAdapter, check_shared_positional
from kerple.checkpoint.reference import LoadedCheckpoint, read_checkpoint
from kerple.checkpoint.run_state import RunState, capture_rng, restore_rng
from kerple.checkpoint.safe_load import TRUST_FLAG, allowed_globals, safe_torch_load
from kerple.checkpoint.sharding import ShardSpec, merge_model_parallel, split_model_parallel
from kerple.checkpoint.writer import save_checkpoint, write_checkpoint

__all__ = [
    "TRUST_FLAG",
    "ArchitectureMismatchError",
    "CheckpointError",
    "LoadedCheckpoint",
    "ModelParallelError",
    "NeoxAdapter",
    "RunState",
    "ShardSpec",
    "UnsafeCheckpointError",
    "allowed_globals",
    "architecture_args",
    "capture_rng",
    "check_architecture",
    "check_shared_positional",
    "checkpoint_architecture",
    "find_checkpoint",
    "list_checkpoints",
    "load_into_model",
    "load_model_weights",
    "merge_model_parallel",
    "positional_option_names",
    "prune_checkpoints",
    "read_checkpoint",
    "restore_rng",
    "safe_torch_load",
    "save_checkpoint",
    "split_model_parallel",
    "state_architecture",
    "tag_for",
    "write_checkpoint",
]
