"""Tensor (model) parallelism for :class:`kerple.model.GPTModel` with megatron-core's layers.

:func:`parallelize` performs module surgery on a model that was built whole (so with a given seed
every ``model_parallel_size`` starts from the same weights), keeping this rank's slice:

=============================  ===========================  ====================================
module                         megatron-core layer          this rank keeps
=============================  ===========================  ====================================
``word_embeddings``            ``VocabParallelEmbedding``   vocab rows ``[V/N, h]``
``attention.query_key_value``  ``ColumnParallelLinear``     rows ``[3h/N, h]`` = its heads
``attention.dense``            ``RowParallelLinear``        columns ``[h, h/N]`` (bias whole)
``mlp.dense_h_to_4h``          ``ColumnParallelLinear``     rows ``[4h/N, h]``
``mlp.dense_4h_to_h``          ``RowParallelLinear``        columns ``[h, 4h/N]`` (bias whole)
``final_linear`` (LM head)     ``ColumnParallelLinear``     vocab rows ``[V/N, h]``
positional (bias kinds)        rebuilt for the local heads  KERPLE/ALiBi ``[H/N, ...]``, T5 ``[32, H/N]``
=============================  ===========================  ====================================

This is exactly the split of the reference checkpoints (:mod:`kerple.checkpoint.sharding`), so a
rank's ``state_dict()``, named by :class:`kerple.checkpoint.neox_layout.NeoxAdapter`, *is* its
``layer_XX-model_YY`` shard. Because the fused QKV rows are laid
out per head (``[H, 3, d]``), a contiguous block of rows holds whole heads, and the attention only
needs its ``num_heads`` / ``hidden_size`` set to the local values.

The LM head produces vocab-parallel logits ``[b, s, V/N]``; :func:`vocab_parallel_loss` turns them
into the full-vocabulary cross entropy with megatron-core's ``vocab_parallel_cross_entropy``. The
head's input enters the tensor-parallel region through a forward hook on the final norm (identity
forward, all-reduce of the gradient in backward), as a column-parallel layer's input does.

Shared positional parameters: the rebuilt module holds this rank's heads only and is still ONE
module shared by all layers; its sliced parameters are marked tensor-parallel so DeepSpeed's
gradient-norm clipping counts each slice once. Dropout inside the tensor-parallel region draws from
the default generator (megatron's CUDA RNG tracker is not used), so with dropout > 0 the masks of
local heads differ from those of ``N = 1``; with dropout 0 (the paper's setting) results match.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kerple.parallel.groups import ParallelState
from kerple.positional.base import PositionKind

IGNORE_INDEX = -100


def _megatron() -> Any:
    """megatron-core's tensor-parallel package (imported lazily: it is slow and only needed for N > 1)."""
    from megatron.core import tensor_parallel

    return tensor_parallel


def _layer_classes() -> tuple[type, type, type]:
    """Subclasses of megatron-core's layers that return a plain tensor and add no ``_extra_state`` key.

    megatron-core's linears store an (empty) ``_extra_state`` and register a load pre-hook that
    inserts it; both are dropped so the state-dict keys stay the reference's.
    """
    tp = _megatron()

    class PlainOutput:
        """Mixin: no ``_extra_state`` (nor the pre-hook that inserts it); forward returns only the
        output, with the bias already added, instead of megatron-core's ``(output, bias)`` pair."""

        get_extra_state = nn.Module.get_extra_state
        set_extra_state = nn.Module.set_extra_state

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._load_state_dict_pre_hooks.clear()

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            output, _ = super().forward(hidden)
            return output

    class ColumnParallel(PlainOutput, tp.ColumnParallelLinear):  # type: ignore[misc, name-defined]
        """``ColumnParallelLinear`` returning ``[b, s, out/N]``."""

    class RowParallel(PlainOutput, tp.RowParallelLinear):  # type: ignore[misc, name-defined]
        """``RowParallelLinear`` (input already split) returning the all-reduced ``[b, s, out]``."""

    return ColumnParallel, RowParallel, tp.VocabParallelEmbedding


def _no_init(_: torch.Tensor) -> None:
    """Weights are copied from the whole model, so megatron-core must not initialise them."""


def megatron_config(parallel: ParallelState, params_dtype: torch.dtype) -> Any:
    """The ``ModelParallelConfig`` for the layers: CPU allocation, no init, no sequence parallelism."""
    from megatron.core.model_parallel_config import ModelParallelConfig

    return ModelParallelConfig(
        tensor_model_parallel_size=parallel.model_parallel_size,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=params_dtype,
        sequence_parallel=False,
    )


def _mark_split(param: nn.Parameter, dim: int) -> None:
    """Mark ``param`` as split over the tensor-parallel ranks along ``dim``.

    DeepSpeed's gradient-norm clipping counts such parameters on every rank and replicated ones on
    rank 0 only; megatron-core sets this only when it initialises the weight itself.
    """
    _megatron().set_tensor_model_parallel_attributes(param, True, dim, 1)


def _shard(tensor: torch.Tensor, dim: int, parallel: ParallelState) -> torch.Tensor:
    """This rank's contiguous block of ``tensor`` along ``dim``."""
    return tensor.detach().chunk(parallel.model_parallel_size, dim=dim)[parallel.model_parallel_rank]


def _column(linear: nn.Linear, config: Any, parallel: ParallelState) -> nn.Module:
    column_cls, _, _ = _layer_classes()
    out_features, in_features = linear.weight.shape
    layer = column_cls(
        in_features, out_features, config=config, init_method=_no_init, bias=linear.bias is not None,
        gather_output=False, tp_group=parallel.model_parallel_group,
    )
    with torch.no_grad():
        layer.weight.copy_(_shard(linear.weight, 0, parallel))  # [out/N, in]
        if linear.bias is not None:
            layer.bias.copy_(_shard(linear.bias, 0, parallel))
    _mark_split(layer.weight, 0)
    return layer


def _row(linear: nn.Linear, config: Any, parallel: ParallelState) -> nn.Module:
    _, row_cls, _ = _layer_classes()
    out_features, in_features = linear.weight.shape
    layer = row_cls(
        in_features, out_features, config=config, init_method=_no_init, bias=linear.bias is not None,
        input_is_parallel=True, skip_bias_add=False, tp_group=parallel.model_parallel_group,
    )
    with torch.no_grad():
        layer.weight.copy_(_shard(linear.weight, 1, parallel))  # [out, in/N]
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())  # added once, after the all-reduce
    _mark_split(layer.weight, 1)
    return layer


def _vocab_embedding(embedding: nn.Embedding, config: Any, parallel: ParallelState) -> nn.Module:
    _, _, vocab_cls = _layer_classes()
    vocab, hidden = embedding.weight.shape
    layer = vocab_cls(vocab, hidden, init_method=_no_init, config=config, tp_group=parallel.model_parallel_group)
    with torch.no_grad():
        layer.weight.copy_(_shard(embedding.weight, 0, parallel))  # [V/N, h]
    _mark_split(layer.weight, 0)
    return layer


def _shard_positional(model: nn.Module, cfg: Any, parallel: ParallelState) -> None:
    """Rebuild the shared positional module for the local heads and copy the matching slice into it.

    Families whose values depend on the global head index (ALiBi, Sandwich, T5's init) get
    ``head_offset`` / ``total_heads``; every tensor with a head dimension is then overwritten with
    the whole model's slice (KERPLE ``[H, 1, 1]`` by rows, T5 ``weight [buckets, H]`` by columns),
    so a loaded or trained value is kept. Input embeddings (learned, sinusoidal) and rotary have no
    per-head tensors and stay as they are.
    """
    from kerple import positional as registry

    old = model.positional
    if old.kind in (PositionKind.INPUT, PositionKind.NONE):
        return
    size, rank = parallel.model_parallel_size, parallel.model_parallel_rank
    local = old.num_heads // size
    with torch.random.fork_rng(devices=[]):  # the throw-away init must not shift the seeded stream
        new = registry.build(
            cfg.positional.pos_emb, num_heads=local, head_dim=old.head_dim, hidden_size=old.hidden_size,
            max_positions=old.max_positions, head_offset=rank * local, total_heads=old.num_heads,
            **cfg.positional.options(),
        )
    full = old.state_dict()
    sliced: dict[str, torch.Tensor] = {}
    split_dims: dict[str, int] = {}
    for name, target in new.state_dict().items():
        source = full[name]
        if source.shape == target.shape:
            sliced[name] = source
            continue
        dims = [
            d for d in range(source.dim())
            if source.shape[d] == target.shape[d] * size
            and source.shape[:d] + source.shape[d + 1 :] == target.shape[:d] + target.shape[d + 1 :]
        ]
        if len(dims) != 1:
            raise ValueError(f"cannot split positional tensor {name} {tuple(source.shape)} into {size} head slices")
        sliced[name] = _shard(source, dims[0], parallel)
        split_dims[name] = dims[0]
    new.load_state_dict(sliced, strict=True)
    new.to(device=old._device())
    for name, param in new.named_parameters():
        if name in split_dims:
            _mark_split(param, split_dims[name])
    model.positional = new


def parallelize(model: nn.Module, cfg: Any, parallel: ParallelState) -> nn.Module:
    """Turn a whole :class:`~kerple.model.GPTModel` into this rank's tensor-parallel part, in place.

    Every rank must build ``model`` identically (same seed) before calling this. Requires
    ``num_attention_heads`` and ``padded_vocab_size`` divisible by ``model_parallel_size`` and the
    megatron-core state set up by :func:`kerple.parallel.groups.init_distributed`. Returns ``model``.
    """
    size = parallel.model_parallel_size
    if size == 1:
        return model
    if model.num_heads % size or model.vocab_size % size:
        raise ValueError(
            f"model_parallel_size {size} must divide num_attention_heads ({model.num_heads}) and "
            f"padded_vocab_size ({model.vocab_size})"
        )
    if parallel.model_parallel_group is None:
        raise ValueError("the tensor-parallel process group is missing; call init_distributed(model_parallel_size=N)")
    dtype = model.embedding.word_embeddings.weight.dtype
    config = megatron_config(parallel, dtype)
    local_heads = model.num_heads // size
    with torch.random.fork_rng(devices=[]):
        model.embedding.word_embeddings = _vocab_embedding(model.embedding.word_embeddings, config, parallel)
        for layer in model.layers:
            attention, mlp = layer.attention, layer.mlp
            attention.query_key_value = _column(attention.query_key_value, config, parallel)
            attention.dense = _row(attention.dense, config, parallel)
            attention.num_heads = local_heads
            attention.hidden_size = local_heads * attention.head_dim
            mlp.dense_h_to_4h = _column(mlp.dense_h_to_4h, config, parallel)
            mlp.dense_4h_to_h = _row(mlp.dense_4h_to_h, config, parallel)
        if model.lm_head is not None:
            model.lm_head = _column(model.lm_head, config, parallel)
    _shard_positional(model, cfg, parallel)
    group = parallel.model_parallel_group
    copy_to_region = _megatron().copy_to_tensor_model_parallel_region

    def enter_head_region(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        # the LM head is column-parallel: its input's gradient is summed over the tensor-parallel ranks
        return copy_to_region(output, group=group)

    model.final_norm.register_forward_hook(enter_head_region)
    model.model_parallel_size = size
    return model


def vocab_parallel_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross entropy from vocab-parallel ``logits [b, s, V/N]``, ``labels [b, s]`` (-100 ignored).

    Equal to :func:`kerple.training.loss.cross_entropy` on the gathered ``[b, s, V]`` logits.
    """
    keep = labels != IGNORE_INDEX
    # megatron-core subtracts the max in place: give it its own fp32 copy, never the caller's logits
    logits32 = logits.clone() if logits.dtype == torch.float32 else logits.float()
    per_token = _megatron().vocab_parallel_cross_entropy(logits32, labels.masked_fill(~keep, 0))  # [b, s]
    return (per_token * keep).sum() / keep.sum().clamp(min=1)
