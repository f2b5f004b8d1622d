"""The ``kerple`` target of the Hugging Face export: ``KerpleForCausalLM`` with its code in the folder.

Beside ``model.safetensors`` and ``config.json`` such a folder holds ``configuration_kerple.py`` and
``modeling_kerple.py`` (copied from :mod:`kerple.checkpoint.hf_remote`), named in
``config.json["auto_map"]``, so ``AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)`` builds the model with only ``torch`` and ``transformers`` installed.
``config.json["positional"]`` is the embedding's
:meth:`~kerple.positional.base.PositionalEmbedding.export_terms` plus the shapes of its stored
tensors, which the weights hold as ``gpt_neox.positional.<key>`` (docs/interop.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from kerple.checkpoint.errors import CheckpointError
from kerple.checkpoint.hf_remote import REMOTE_CODE_DIR, REMOTE_FILES

AUTO_MAP = {
    "AutoConfig": "configuration_kerple.KerpleConfig",
    "AutoModelForCausalLM": "modeling_kerple.KerpleForCausalLM",
}
# Why no stock class computes an embedding, where more than "no class has this bias" is worth saying.
_NO_STOCK_CLASS = {
    "alibi": (
        "no stock class computes GPT-NeoX's ALiBi: BLOOM adds a LayerNorm after the word embeddings and "
        "uses tanh-GELU, Falcon adds the bias before the 1/sqrt(head_dim) scaling, MPT has no linear biases"
    ),
    "learned": "GPT-2 has only the sequential residual and GPT-NeoX no learned position table",
}
_NO_STOCK_CLASS["kerple_power_original"] = _NO_STOCK_CLASS["alibi"]


def norm_epsilon(config: dict[str, Any]) -> float:
    """The epsilon of the config's norm (``rms_norm_epsilon``, ``scalenorm_epsilon`` or ``layernorm_epsilon``)."""
    keys = {"rmsnorm": "rms_norm_epsilon", "scalenorm": "scalenorm_epsilon"}
    value = config.get(keys.get(config.get("norm", "layernorm"), "layernorm_epsilon"))
    return 1e-5 if value is None else float(value)


def positional_description(config: dict[str, Any], state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``config.json["positional"]``: the terms of the config's embedding loaded with ``state``'s
    ``positional.*`` tensors, and ``tensors``: ``{key: {"shape": [...], "trainable": bool}}``."""
    from kerple import positional as registry

    pos_emb = str(config.get("pos_emb", "learned"))
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    options = {name: config[name] for name in registry.option_names() if config.get(name) is not None}
    module = registry.build(
        pos_emb,
        num_heads=heads,
        head_dim=hidden // heads,
        hidden_size=hidden,
        max_positions=int(config.get("max_position_embeddings") or config.get("seq_length") or 2048),
        num_layers=len({name.split(".")[1] for name in state if name.startswith("layers.")}) or 1,
        **options,
    )
    stored = {name[len("positional."):]: tensor for name, tensor in state.items() if name.startswith("positional.")}
    try:
        module.load_state_dict(stored, strict=True)
        terms = module.export_terms()
    except NotImplementedError as error:  # a RuntimeError too: caught first
        raise CheckpointError(f"pos_emb {pos_emb!r} cannot be exported as KerpleForCausalLM: {error}") from None
    except RuntimeError as error:
        raise CheckpointError(f"the weights' positional tensors do not fit pos_emb {pos_emb!r}: {error}") from None
    trainable = {name for name, _ in module.named_parameters()}
    tensors = {name: {"shape": list(t.shape), "trainable": name in trainable} for name, t in module.state_dict().items()}
    return {**terms, "tensors": tensors}


def kerple_config(config: dict[str, Any], state: dict[str, torch.Tensor], common: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` fields of a ``KerpleForCausalLM`` folder (``common``: vocabulary, tying, dtype, tokens)."""
    hidden = int(config["hidden_size"])
    return {
        "architectures": ["KerpleForCausalLM"],
        "model_type": "kerple",
        "auto_map": dict(AUTO_MAP),
        "hidden_size": hidden,
        "num_hidden_layers": len({name.split(".")[1] for name in state if name.startswith("layers.")}),
        "num_attention_heads": int(config["num_attention_heads"]),
        "intermediate_size": 4 * hidden,
        "hidden_act": config.get("activation", "gelu"),
        "norm": config.get("norm", "layernorm"),
        "layer_norm_eps": norm_epsilon(config),
        "use_parallel_residual": bool(config.get("gpt_j_residual", False)),
        # a learned table's rows are the one limit on the input length; for every other embedding the
        # training length is no limit, and transformers warns about any input past max_position_embeddings
        "max_position_embeddings": learned_table_rows(state),
        "training_length": int(config["seq_length"]) if config.get("seq_length") else None,
        "attention_window": config.get("attention_window"),
        "positional_embedding": str(config.get("pos_emb", "learned")),
        "positional": positional_description(config, state),
        **common,
    }


def learned_table_rows(state: dict[str, torch.Tensor]) -> int | None:
    """The rows of the learned absolute position table in ``state``; ``None`` without one."""
    table = state.get("positional.position_embeddings.weight")
    return None if table is None else int(table.shape[0])


def write_remote_code(folder: Path) -> None:
    """Copy ``configuration_kerple.py`` and ``modeling_kerple.py`` into ``folder``."""
    for name in REMOTE_FILES:
        shutil.copyfile(REMOTE_CODE_DIR / name, folder / name)


def export_note(config: dict[str, Any], target: str, chosen: str) -> str:
    """One line for the export log: which class the folder loads in, and why that one.

    ``target`` is the class's target name, ``chosen`` the one :func:`target_for` picks by itself.
    """
    pos_emb = str(config.get("pos_emb", "learned"))
    if target == "gpt_neox":
        return f"{pos_emb}: stock transformers GPTNeoXForCausalLM (model_type gpt_neox), no remote code"
    if target == "gpt2":
        return f"{pos_emb}: stock transformers GPT2LMHeadModel (model_type gpt2), no remote code"
    if chosen != "kerple":
        reason = f"as asked; the stock class of target {chosen!r} computes the same function"
    elif config.get("norm", "layernorm") != "layernorm" or config.get("activation", "gelu") != "gelu":
        reason = f"no stock GPT-NeoX-like class has norm {config.get('norm')!r} with activation {config.get('activation')!r}"
    elif config.get("attention_window") is not None:
        reason = f"no stock GPT-NeoX-like class restricts attention to the last {config['attention_window']} keys"
    else:
        reason = _NO_STOCK_CLASS.get(pos_emb, f"no stock transformers class computes the {pos_emb!r} term")
    return (
        f"{pos_emb}: KerpleForCausalLM from the folder's modeling_kerple.py "
        f"(load with trust_remote_code=True; {reason})"
    )
