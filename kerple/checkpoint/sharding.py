"""Model-parallel merge / re-split of GPT-NeoX state dicts (Megatron tensor parallelism).

How each reference tensor is partitioned over ``mp`` model-parallel ranks (docs/reference-format.md §6):

* column-parallel, split by **rows** (dim 0): ``attention.query_key_value.{weight,bias}``,
  ``mlp.dense_h_to_4h.{weight,bias}``, ``word_embeddings.weight`` (by vocab rows) and the head
  ``final_linear.weight`` when ``output_layer_parallelism`` is ``column``;
* row-parallel, split by **columns** (dim 1): ``attention.dense.weight``,
  ``mlp.dense_4h_to_h.weight`` (and ``final_linear.weight`` under ``row`` parallelism);
* per-head positional tensors, split by **heads**: KERPLE ``rpe.bias_p``/``bias_a``/``wei_*``
  ``[H, 1, 1]`` and ALiBi ``alibi_embed.slopes`` ``[H]`` along dim 0, T5 ``rpe.weight``
  ``[buckets, H]`` along dim 1;
* everything else is replicated (norms, the row-parallel biases, learned position table,
  rotary ``inv_freq``).

The fused QKV rows of one rank are laid out ``[heads_local, 3, head_dim]`` (q, k, v interleaved per
head) and heads are split contiguously over ranks, so concatenating the ranks' rows in rank order
gives the full ``[H, 3, head_dim]`` layout: no permutation is needed, in either direction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kerple.checkpoint.errors import ModelParallelError
from kerple.checkpoint.neox_layout import layer_key

COLUMN_PARALLEL: frozenset[str] = frozenset(
    {
        "attention.query_key_value.weight",
        "attention.query_key_value.bias",
        "mlp.dense_h_to_4h.weight",
        "mlp.dense_h_to_4h.bias",
        "word_embeddings.weight",
    }
)
ROW_PARALLEL: frozenset[str] = frozenset({"attention.dense.weight", "mlp.dense_4h_to_h.weight"})
PER_HEAD_MODULES: tuple[str, ...] = ("attention.rpe.", "attention.alibi_embed.")
HEAD_KEY = "final_linear.weight"


@dataclass(frozen=True)
class ShardSpec:
    """Sizes needed to tell split tensors from replicated ones.

    ``output_layer_parallelism``: ``column`` (LM head split by vocab rows) or ``row`` (by hidden
    columns); when merging it is detected from the shapes, this value is used for splitting.
    """

    num_heads: int
    hidden_size: int
    output_layer_parallelism: str = "column"


def _head_dim_of(key: str, tensor: torch.Tensor) -> int | None:
    """The head dimension of a per-head positional tensor, ``None`` if it is not per-head."""
    if not key.startswith(PER_HEAD_MODULES) or tensor.dim() == 0:
        return None
    return 1 if key == "attention.rpe.weight" and tensor.dim() == 2 else 0


def _merge_dim(key: str, piece: torch.Tensor, spec: ShardSpec, ranks: int) -> int | None:
    """Dimension along which the ``ranks`` pieces of ``key`` are concatenated; ``None``: replicated."""
    if key in COLUMN_PARALLEL:
        return 0
    if key in ROW_PARALLEL:
        return 1
    if key == HEAD_KEY:
        return 0 if piece.shape[-1] == spec.hidden_size else 1
    head_dim = _head_dim_of(key, piece)
    if head_dim is None:
        return None
    size = piece.shape[head_dim]
    if size == spec.num_heads:
        return None
    if size * ranks == spec.num_heads:
        return head_dim
    raise ModelParallelError(
        f"per-head tensor {key!r} has {size} heads along dim {head_dim} on one of {ranks} model-parallel "
        f"ranks, which is neither all {spec.num_heads} heads nor {spec.num_heads}/{ranks}; "
        "check num_attention_heads"
    )


def _split_dim(key: str, tensor: torch.Tensor, spec: ShardSpec) -> int | None:
    if key in COLUMN_PARALLEL:
        return 0
    if key in ROW_PARALLEL:
        return 1
    if key == HEAD_KEY:
        return 0 if spec.output_layer_parallelism == "column" else 1
    head_dim = _head_dim_of(key, tensor)
    if head_dim is not None and tensor.shape[head_dim] == spec.num_heads:
        return head_dim
    return None


def merge_model_parallel(ranks: list[dict[str, torch.Tensor]], spec: ShardSpec) -> dict[str, torch.Tensor]:
    """Join the state dicts of ``len(ranks)`` model-parallel ranks into one full state dict.

    Keys may be full (``sequential.N.key``) or per-layer (``key``); the partition rule reads the
    per-layer part. Every rank must hold the same keys.
    """
    if not ranks:
        raise ModelParallelError("no model-parallel ranks to merge")
    if len(ranks) == 1:
        return dict(ranks[0])
    names = list(ranks[0])
    for rank, state in enumerate(ranks[1:], start=1):
        if set(state) != set(names):
            missing = sorted(set(names) - set(state))[:5]
            extra = sorted(set(state) - set(names))[:5]
            raise ModelParallelError(
                f"model-parallel rank {rank} holds different tensors than rank 0 "
                f"(missing: {missing}, extra: {extra}); the checkpoint is incomplete or mixed"
            )
    merged: dict[str, torch.Tensor] = {}
    for name in names:
        key = layer_key(name)
        pieces = [state[name] for state in ranks]
        dim = _merge_dim(key, pieces[0], spec, len(ranks))
        if dim is None:
            merged[name] = pieces[0]
            continue
        try:
            merged[name] = torch.cat(pieces, dim=dim)
        except RuntimeError as err:
            shapes = [tuple(p.shape) for p in pieces]
            raise ModelParallelError(f"cannot join the model-parallel pieces of {name!r} along dim {dim}: shapes {shapes}") from err
    return merged


def split_model_parallel(state: dict[str, torch.Tensor], ranks: int, spec: ShardSpec) -> list[dict[str, torch.Tensor]]:
    """Split a full state dict into ``ranks`` model-parallel state dicts (inverse of the merge)."""
    if ranks < 1:
        raise ModelParallelError(f"model-parallel size must be >= 1, got {ranks}")
    if ranks == 1:
        return [dict(state)]
    if spec.num_heads % ranks:
        raise ModelParallelError(
            f"cannot split {spec.num_heads} attention heads over model_parallel_size {ranks}: "
            "num_attention_heads must be divisible by it"
        )
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(ranks)]
    for name, tensor in state.items():
        key = layer_key(name)
        dim = _split_dim(key, tensor, spec)
        if dim is None:
            for shard in out:
                shard[name] = tensor.clone()
            continue
        if tensor.shape[dim] % ranks:
            raise ModelParallelError(
                f"{name!r} has size {tensor.shape[dim]} along dim {dim}, not divisible by model_parallel_size "
                f"{ranks}" + (" (pad the vocabulary: make_vocab_size_divisible_by)" if "word_embeddings" in key or key == HEAD_KEY else "")
            )
        for shard, piece in zip(out, tensor.chunk(ranks, dim=dim)):
            shard[name] = piece.clone()
    return out
