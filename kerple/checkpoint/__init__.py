"""Reading, checking, converting and writing GPT-NeoX / KERPLE checkpoints safely.

Public API:

* :func:`safe_torch_load` - ``torch.load`` that runs no code from the file (``trust`` opts out);
* :func:`read_checkpoint` -> :class:`LoadedCheckpoint` - any reference or kerple checkpoint
  directory (``latest`` / iteration, pipeline or sequential layout, any model-parallel size) as
  one full ``sequential.<N>.*`` state dict;
* :func:`check_architecture`, :func:`load_into_model`, :func:`load_model_weights` - check against a
  config and load into a :class:`kerple.model.GPTModel`;
* :func:`merge_model_parallel`, :func:`split_model_parallel`, :class:`ShardSpec` - Megatron
  tensor-parallel layouts;
* :func:`write_checkpoint` - write a state dict in the pipeline or sequential layout;
* :func:`export_huggingface`, :func:`import_huggingface` - Hugging Face folders
  (``kerple.checkpoint.huggingface``).
"""

from kerple.checkpoint.errors import (
    ArchitectureMismatchError,
    CheckpointError,
    ModelParallelError,
    UnsafeCheckpointError,
)
from kerple.checkpoint.loading import check_architecture, checkpoint_architecture, load_into_model, load_model_weights
from kerple.checkpoint.reference import LoadedCheckpoint, read_checkpoint, resolve_checkpoint_dir
from kerple.checkpoint.safe_load import TRUST_FLAG, allowed_globals, safe_torch_load
from kerple.checkpoint.sharding import ShardSpec, check_shared_positional, merge_model_parallel, split_model_parallel
from kerple.checkpoint.writer import write_checkpoint

__all__ = [
    "TRUST_FLAG",
    "ArchitectureMismatchError",
    "CheckpointError",
    "LoadedCheckpoint",
    "ModelParallelError",
    "ShardSpec",
    "UnsafeCheckpointError",
    "allowed_globals",
    "check_architecture",
    "check_shared_positional",
    "checkpoint_architecture",
    "load_into_model",
    "load_model_weights",
    "merge_model_parallel",
    "read_checkpoint",
    "resolve_checkpoint_dir",
    "safe_torch_load",
    "split_model_parallel",
    "write_checkpoint",
]
