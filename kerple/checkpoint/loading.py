"""Check a read checkpoint against a config and load it into a :class:`kerple.model.GPTModel`.

:func:`check_architecture` names **every** field that differs (shapes read from the tensors
themselves, the rest from ``args`` / ``configs/*.yml``); :func:`load_into_model` names every
missing, unexpected or mis-shaped key. :func:`load_model_weights` does both after
:func:`kerple.checkpoint.reference.read_checkpoint`, and can hand a model-parallel rank its shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from kerple.checkpoint.errors import ArchitectureMismatchError
from kerple.checkpoint.reference import LoadedCheckpoint, read_checkpoint, transformer_indices
from kerple.checkpoint.sharding import ShardSpec, split_key, split_model_parallel

# Option fields compared when the checkpoint records them (args of this project, or the YAML).
_OPTION_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "gpt_j_residual"),
    ("model", "norm"),
    ("model", "activation"),
    ("positional", "rotary_pct"),
    ("positional", "rotary_emb_base"),
    ("positional", "rpe_num_buckets"),
    ("positional", "rpe_max_distance"),
    ("positional", "alibi_slope_shift"),
    ("positional", "alibi_equal_slope"),
    ("positional", "sandwich_dim"),
)


def checkpoint_architecture(ckpt: LoadedCheckpoint) -> dict[str, Any]:
    """Architecture fields of a checkpoint: shapes from the tensors, the rest as recorded."""
    state = ckpt.state_dict
    recorded = {**ckpt.config, **ckpt.args, **(ckpt.args.get("positional_options") or {})}
    layers = transformer_indices(state)
    arch: dict[str, Any] = {"num_layers": len(layers)}
    embedding = state.get("sequential.0.word_embeddings.weight")
    if embedding is not None:
        arch["padded_vocab_size"], arch["hidden_size"] = int(embedding.shape[0]), int(embedding.shape[1])
    heads = recorded.get("num_attention_heads")
    if heads is not None:
        arch["num_attention_heads"] = int(heads)
    arch["no_weight_tying"] = f"sequential.{len(layers) + 4}.final_linear.weight" in state
    table = state.get("sequential.0.position_embeddings.weight")
    if table is not None:
        arch["max_position_embeddings"] = int(table.shape[0])
    if ckpt.pos_emb is not None:
        arch["pos_emb"] = ckpt.pos_emb
    for _, name in _OPTION_FIELDS:
        if recorded.get(name) is not None:
            arch[name] = recorded[name]
    return arch


def _config_value(cfg: Any, section: str, name: str) -> Any:
    return getattr(getattr(cfg, section, None), name, None)


def check_architecture(ckpt: LoadedCheckpoint, cfg: Any) -> None:
    """Raise :class:`ArchitectureMismatchError` naming every field where ``ckpt`` and ``cfg`` differ."""
    arch = checkpoint_architecture(ckpt)
    model = cfg.model
    wanted: dict[str, Any] = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "padded_vocab_size": model.padded_vocab_size,
        "no_weight_tying": model.no_weight_tying,
        "pos_emb": cfg.positional.pos_emb,
        "max_position_embeddings": model.max_position_embeddings or model.seq_length,
    }
    for section, name in _OPTION_FIELDS:
        wanted[name] = _config_value(cfg, section, name)
    problems: list[str] = []
    fields: list[str] = []
    for name, value in arch.items():
        want = wanted.get(name)
        if want is None and name not in ("pos_emb",):
            continue
        same = float(value) == float(want) if isinstance(value, (int, float)) and isinstance(want, (int, float)) else value == want
        if same:
            continue
        fields.append(name)
        hint = ""
        if name == "padded_vocab_size" and ckpt.model_parallel_size > 1:
            hint = (
                f" (the checkpoint was padded for model_parallel_size {ckpt.model_parallel_size}: set "
                f"make_vocab_size_divisible_by so that vocab_size pads to {value})"
            )
        elif name == "no_weight_tying":
            hint = " (the checkpoint " + ("has an untied head final_linear)" if value else "ties the head to word_embeddings)")
        problems.append(f"{name}: checkpoint {value!r} vs config {want!r}{hint}")
    if problems:
        raise ArchitectureMismatchError(
            f"checkpoint {ckpt.path} does not match the config: {'; '.join(problems)}. Use the config the "
            f"checkpoint was trained with (its configs/ folder) or override these keys.",
            fields,
        )


def load_into_model(model: nn.Module, state: dict[str, torch.Tensor], source: str | Path) -> None:
    """``model.load_state_dict(state)`` after reconciling derived buffers; errors name every bad key.

    * A tied model (no LM-head stage) drops the head stage's copy of ``word_embeddings.weight``
      that pipeline checkpoints with tied embeddings store.
    * ``*.inv_freq`` (rotary / sinusoidal frequencies) are recomputable: if the model has no such
      key it is dropped; if it has one, the stored value must agree to 1% (bf16 checkpoints round
      it) and the model keeps its own exact fp32 value; a checkpoint without them (stock HF
      exports) gets the model's.
    """
    own = model.state_dict()
    state = dict(state)
    for name in list(state):
        index, key = split_key(name)
        if name in own:
            if key.endswith("inv_freq"):
                stored, mine = state[name].float().cpu(), own[name].float().cpu()
                if stored.shape != mine.shape or not torch.allclose(stored, mine, rtol=1e-2, atol=0.0):
                    raise ArchitectureMismatchError(
                        f"checkpoint {source}: {name} (rotary frequencies) differ from the model's; check "
                        "rotary_pct and rotary_emb_base",
                        ["rotary_pct", "rotary_emb_base"],
                    )
                state[name] = own[name]
            continue
        if key.endswith("inv_freq") or (key == "word_embeddings.weight" and index != 0):
            del state[name]
    for name in own:
        if name.endswith("inv_freq") and name not in state:
            state[name] = own[name]  # derived from the config, not learned
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if state[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")
        if unexpected:
            parts.append(f"not in the model: {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}")
        if shapes:
            parts.append("shape mismatch: " + "; ".join(shapes[:10]))
        raise ArchitectureMismatchError(
            f"checkpoint {source} does not fit the model ({' | '.join(parts)}). Use the model and positional "
            "config the checkpoint was trained with.",
            [],
        )
    model.load_state_dict(state, strict=True)


def load_model_weights(
    model: nn.Module,
    load_dir: str | Path,
    iteration: int | None = None,
    *,
    cfg: Any = None,
    trust: bool = False,
    model_parallel_size: int = 1,
    model_parallel_rank: int = 0,
) -> int:
    """Load any GPT-NeoX / KERPLE / kerple checkpoint into ``model``; return its iteration.

    ``cfg`` (a :class:`kerple.config.Config`) enables :func:`check_architecture`. With
    ``model_parallel_size > 1`` the merged weights are re-split and this rank's shard is loaded
    (``model`` must then be the rank's tensor-parallel model).
    """
    ckpt = read_checkpoint(load_dir, iteration, trust=trust, num_heads=getattr(model, "num_heads", None))
    if cfg is not None:
        check_architecture(ckpt, cfg)
    state = ckpt.state_dict
    if model_parallel_size > 1:
        heads = int(ckpt.args.get("num_attention_heads") or cfg.model.num_attention_heads)
        hidden = int(state["sequential.0.word_embeddings.weight"].shape[1])
        state = split_model_parallel(state, model_parallel_size, ShardSpec(heads, hidden))[model_parallel_rank]
    load_into_model(model, state, ckpt.path)
    return ckpt.iteration
