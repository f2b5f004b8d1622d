"""Reference-layout checkpoints built in the tests from the key list of docs/reference-format.md §6.

Nothing here uses ``kerple.checkpoint``: the files are laid out and split the way the reference
writes them (heads split contiguously over model-parallel ranks, each rank's fused QKV rows
``[heads_local, 3, head_dim]``), so the reader is tested against an independent writer.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kerple.checkpoint import NeoxAdapter
from kerple.config import load_config
from kerple.model import build_model

LAYERS, HIDDEN, HEADS, VOCAB = 2, 32, 4, 64
HEAD_DIM = HIDDEN // HEADS

# docs/reference-format.md §6: per-layer keys of every transformer layer file.
LAYER_KEYS = (
    "input_layernorm.weight",
    "input_layernorm.bias",
    "attention.query_key_value.weight",
    "attention.query_key_value.bias",
    "attention.dense.weight",
    "attention.dense.bias",
    "post_attention_layernorm.weight",
    "post_attention_layernorm.bias",
    "mlp.dense_h_to_4h.weight",
    "mlp.dense_h_to_4h.bias",
    "mlp.dense_4h_to_h.weight",
    "mlp.dense_4h_to_h.bias",
)
POSITIONAL_KEYS = {
    "kerple_log": {"attention.rpe.bias_p": (HEADS, 1, 1), "attention.rpe.bias_a": (HEADS, 1, 1)},
    "kerple_power_ap_": {"attention.rpe.bias_p": (HEADS, 1, 1), "attention.rpe.bias_a": (HEADS, 1, 1)},
    "rpe": {"attention.rpe.weight": (32, HEADS)},
    "alibi": {"attention.alibi_embed.slopes": (HEADS,)},
    "rotary": {},
    "learned": {},
}


def tiny_config(pos_emb: str = "kerple_log", **overrides):
    """The config matching the tiny reference checkpoints (vocab padded to exactly 64)."""
    values = {
        "num_layers": LAYERS,
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "vocab_size": VOCAB,
        "make_vocab_size_divisible_by": 8,
        "seq_length": 48,
        "pos_emb": pos_emb,
        "attention_impl": "eager",
        "no_weight_tying": True,  # the tiny reference checkpoints have an untied head
    }
    values.update(overrides)
    return load_config([], values)


def tiny_model(pos_emb: str = "kerple_log", **overrides):
    return build_model(tiny_config(pos_emb, **overrides), flex_compile=False).eval()


def reference_tensors(pos_emb: str, seed: int = 0, layers: int = LAYERS) -> dict[int, dict[str, torch.Tensor]]:
    """Random full weights ``{pipeline index: {reference key: tensor}}`` for ``pos_emb``."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    shapes = {
        "input_layernorm.weight": (HIDDEN,),
        "input_layernorm.bias": (HIDDEN,),
        "attention.query_key_value.weight": (3 * HIDDEN, HIDDEN),
        "attention.query_key_value.bias": (3 * HIDDEN,),
        "attention.dense.weight": (HIDDEN, HIDDEN),
        "attention.dense.bias": (HIDDEN,),
        "post_attention_layernorm.weight": (HIDDEN,),
        "post_attention_layernorm.bias": (HIDDEN,),
        "mlp.dense_h_to_4h.weight": (4 * HIDDEN, HIDDEN),
        "mlp.dense_h_to_4h.bias": (4 * HIDDEN,),
        "mlp.dense_4h_to_h.weight": (HIDDEN, 4 * HIDDEN),
        "mlp.dense_4h_to_h.bias": (HIDDEN,),
    }
    files: dict[int, dict[str, torch.Tensor]] = {0: {"word_embeddings.weight": rand(VOCAB, HIDDEN)}}
    if pos_emb == "learned":
        files[0]["position_embeddings.weight"] = rand(48, HIDDEN)
    shared = {key: rand(*shape).abs() + 0.05 for key, shape in POSITIONAL_KEYS[pos_emb].items()}
    if pos_emb == "rotary":
        shared["attention.rotary_emb.inv_freq"] = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    for layer in range(layers):
        tensors = {key: rand(*shape) for key, shape in shapes.items()}
        tensors.update({key: value.clone() for key, value in shared.items()})  # identical copy per layer
        files[layer + 2] = tensors
    files[layers + 3] = {"norm.weight": 1.0 + rand(HIDDEN), "norm.bias": rand(HIDDEN)}
    files[layers + 4] = {"final_linear.weight": rand(VOCAB, HIDDEN)}
    return files


def reference_shard(key: str, tensor: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    """This rank's piece of ``tensor`` as Megatron tensor parallelism lays it out."""
    if ranks == 1:
        return tensor.clone()
    local = HEADS // ranks
    heads = slice(rank * local, (rank + 1) * local)
    if key.startswith("attention.query_key_value."):
        per_head = tensor.view(HEADS, 3 * HEAD_DIM, *tensor.shape[1:])  # rows grouped by head
        return per_head[heads].reshape(local * 3 * HEAD_DIM, *tensor.shape[1:]).clone()
    if key in ("mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias", "word_embeddings.weight", "final_linear.weight"):
        return tensor.chunk(ranks, dim=0)[rank].clone()
    if key in ("attention.dense.weight", "mlp.dense_4h_to_h.weight"):
        return tensor.chunk(ranks, dim=1)[rank].clone()
    if key in ("attention.rpe.bias_p", "attention.rpe.bias_a", "attention.alibi_embed.slopes"):
        return tensor[heads].clone()
    if key == "attention.rpe.weight":
        return tensor[:, heads].clone()
    return tensor.clone()


def write_reference_checkpoint(
    root: Path,
    files: dict[int, dict[str, torch.Tensor]],
    *,
    pos_emb: str,
    ranks: int = 1,
    layout: str = "pipeline",
    iteration: int = 50,
    args_overrides: dict | None = None,
) -> Path:
    """Write ``files`` as the reference does; return the save directory (holding ``latest``)."""
    tag = root / f"global_step{iteration}"
    (tag / "configs").mkdir(parents=True)
    (root / "latest").write_text(f"global_step{iteration}")
    (tag / "configs" / "model.yml").write_text(f'{{"pos-emb": "{pos_emb}", "no-weight-tying": true, "num-layers": {LAYERS}}}\n')
    args = {
        "num_layers": LAYERS,
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "max_position_embeddings": 48,
        "make_vocab_size_divisible_by": 8,
        "padded_vocab_size": VOCAB,
        "tokenizer_type": "GPT2BPETokenizer",
        "model_parallel_size": ranks,
    }
    args.update(args_overrides or {})
    for rank in range(ranks):
        sharded = {index: {key: reference_shard(key, t, rank, ranks) for key, t in tensors.items()} for index, tensors in files.items()}
        meta = {"iteration": iteration, "args": args, "module": None, "optimizer": None, "mp_world_size": ranks}
        if layout == "pipeline":
            for index, tensors in sharded.items():
                torch.save(tensors, tag / f"layer_{index:02d}-model_{rank:02d}-model_states.pt")
        else:
            meta["module"] = {f"sequential.{i}.{k}": t for i, tensors in sharded.items() for k, t in tensors.items()}
        torch.save(meta, tag / f"mp_rank_{rank:02d}_model_states.pt")
    return root


def full_state(files: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"sequential.{index}.{key}": t for index, tensors in files.items() for key, t in tensors.items()}


def load_reference(model, files: dict[int, dict[str, torch.Tensor]]) -> None:
    """Load the reference's files into ``model`` through the state-dict adapter (strict)."""
    model.load_state_dict(NeoxAdapter.for_model(model).from_reference(full_state(files)), strict=True)


def state_dicts_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Keys whose tensors differ (missing keys included); empty when ``a`` and ``b`` are identical."""
    names = sorted(set(a) | set(b))
    return [n for n in names if n not in a or n not in b or a[n].dtype != b[n].dtype or not torch.equal(a[n], b[n])]
