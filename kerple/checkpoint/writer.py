"""Write a full state dict as a GPT-NeoX-style checkpoint (pipeline or sequential, any MP size).

The tag directory is built under a temporary name and renamed into place; ``latest`` is then
replaced atomically, so an interrupted conversion never leaves a half-written checkpoint that
``latest`` points to.

Flavours: ``kerple`` (this project: ``args`` with ``pos_emb`` and the positional options, and the
``kerple_checkpoint_format`` marker) and ``neox`` (the reference's ``args`` fields only; the
embedding is then named in ``configs/*.yml`` as the reference does).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from kerple.atomic import torch_save_atomic, write_text_atomic
from kerple.checkpoint.errors import CheckpointError
from kerple.checkpoint.reference import LATEST_FILE
from kerple.checkpoint.sharding import ShardSpec, split_key, split_model_parallel

FORMAT_VERSION = 1
REFERENCE_ARGS: tuple[str, ...] = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "max_position_embeddings",
    "make_vocab_size_divisible_by",
    "padded_vocab_size",
    "tokenizer_type",
    "model_parallel_size",
)


def write_checkpoint(
    out_dir: str | Path,
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
    """Write ``state`` (full, ``sequential.N.key``) as ``out_dir/global_step<iteration>``; return it.

    ``args`` must hold at least ``num_attention_heads``; ``config_files`` (file name -> YAML text)
    are written under ``configs/``. Refuses to overwrite an existing tag directory.
    """
    if layout not in ("pipeline", "sequential"):
        raise CheckpointError(f"unknown layout {layout!r}; choose pipeline or sequential")
    if flavor not in ("kerple", "neox"):
        raise CheckpointError(f"unknown flavor {flavor!r}; choose kerple or neox")
    root = Path(out_dir)
    tag = f"global_step{int(iteration)}"
    final = root / tag
    if final.exists():
        raise CheckpointError(f"{final} already exists; choose another output directory")
    hidden = int(state["sequential.0.word_embeddings.weight"].shape[1])
    spec = ShardSpec(int(args["num_attention_heads"]), hidden, output_layer_parallelism)
    shards = split_model_parallel(state, model_parallel_size, spec)
    record = dict(args)
    record["model_parallel_size"] = model_parallel_size
    if flavor == "neox":
        record = {key: record[key] for key in REFERENCE_ARGS if key in record}
    root.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{tag}-"))
    try:
        for rank, shard in enumerate(shards):
            meta: dict[str, Any] = {
                "iteration": int(iteration),
                "args": record,
                "mp_world_size": model_parallel_size,
                "module": None,
                "optimizer": None,
            }
            if flavor == "kerple":
                meta["kerple_checkpoint_format"] = FORMAT_VERSION
            if layout == "sequential":
                meta["module"] = {name: tensor.detach().cpu().clone() for name, tensor in shard.items()}
            else:
                by_index: dict[int, dict[str, torch.Tensor]] = {}
                for name, tensor in shard.items():
                    index, key = split_key(name)
                    by_index.setdefault(index, {})[key] = tensor.detach().cpu().clone()
                for index, tensors in sorted(by_index.items()):
                    torch_save_atomic(tensors, temporary / f"layer_{index:02d}-model_{rank:02d}-model_states.pt")
            torch_save_atomic(meta, temporary / f"mp_rank_{rank:02d}_model_states.pt")
        if config_files:
            (temporary / "configs").mkdir()
            for name, text in config_files.items():
                write_text_atomic(temporary / "configs" / name, text)
        os.replace(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    write_text_atomic(root / LATEST_FILE, tag)
    return final
