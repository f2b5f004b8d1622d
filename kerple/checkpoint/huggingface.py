"""Hugging Face-style folders: ``model.safetensors`` + ``config.json`` + tokenizer files, both ways.

Which class an export loads in (see docs/interop.md):

* ``gpt_neox`` - :class:`transformers.GPTNeoXForCausalLM`, for ``rotary`` (``rotary_pct``,
  ``rotary_emb_base``) and ``none`` (NoPE = rotary with ``partial_rotary_factor`` 0), LayerNorm,
  exact GELU, either residual form (``use_parallel_residual`` = ``gpt_j_residual``). The fused QKV
  of HF GPTNeoX is laid out per head exactly as GPT-NeoX's, so tensors are renamed, not permuted.
* ``gpt2`` - :class:`transformers.GPT2LMHeadModel`, for ``learned`` absolute positions (HF GPTNeoX
  has no learned position table) with the sequential residual: GPT-2 is the same pre-LN block, so
  the weights map exactly (Conv1D stores ``W^T``; its ``c_attn`` wants q, k, v blocks, not
  per-head interleaving, so those rows are permuted).
* ``kerple`` - every other embedding (KERPLE, ALiBi, T5, Sandwich, Gaussian-like, sinusoidal) and
  any other norm/activation: GPTNeoX tensor names plus the shared positional tensors once under
  ``kerple_positional.*``; ``config.json`` describes the embedding. No stock class computes these
  biases, so such folders load back into kerple only.

Every export stores the full kerple config under ``config.json["kerple"]`` so an import restores it
exactly; folders from elsewhere (e.g. Pythia) are imported from the standard fields.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable

import torch

from kerple.checkpoint.errors import CheckpointError
from kerple.checkpoint.sharding import is_positional, split_key

LAYER_KEYS: tuple[str, ...] = (
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
POSITIONAL_PREFIX = "kerple_positional."
# (kerple layer key, GPT-2 key, transpose for Conv1D)
_GPT2_LAYER = (
    ("input_layernorm.weight", "ln_1.weight", False),
    ("input_layernorm.bias", "ln_1.bias", False),
    ("attention.dense.weight", "attn.c_proj.weight", True),
    ("attention.dense.bias", "attn.c_proj.bias", False),
    ("post_attention_layernorm.weight", "ln_2.weight", False),
    ("post_attention_layernorm.bias", "ln_2.bias", False),
    ("mlp.dense_h_to_4h.weight", "mlp.c_fc.weight", True),
    ("mlp.dense_h_to_4h.bias", "mlp.c_fc.bias", False),
    ("mlp.dense_4h_to_h.weight", "mlp.c_proj.weight", True),
    ("mlp.dense_4h_to_h.bias", "mlp.c_proj.bias", False),
)


def _architecture(config: dict[str, Any]) -> dict[str, Any]:
    """Fields of a flat kerple config dict (``Config.to_dict()``) used by the exporters."""
    hidden = int(config["hidden_size"])
    seq_length = int(config.get("seq_length") or 2048)
    return {
        "num_layers": int(config["num_layers"]),
        "hidden_size": hidden,
        "num_attention_heads": int(config["num_attention_heads"]),
        "pos_emb": str(config.get("pos_emb", "learned")),
        "norm": config.get("norm", "layernorm"),
        "activation": config.get("activation", "gelu"),
        "gpt_j_residual": bool(config.get("gpt_j_residual", False)),
        "layernorm_epsilon": float(config.get("layernorm_epsilon", 1e-5)),
        "max_positions": int(config.get("max_position_embeddings") or seq_length),
        "rotary_pct": float(config.get("rotary_pct", 1.0)),
        "rotary_emb_base": float(config.get("rotary_emb_base", 10000.0)),
    }


def target_for(config: dict[str, Any]) -> str:
    """``gpt_neox``, ``gpt2`` or ``kerple``: the class a model with ``config`` exports to."""
    arch = _architecture(config)
    if arch["norm"] != "layernorm" or arch["activation"] != "gelu":
        return "kerple"
    if arch["pos_emb"] in ("rotary", "none"):
        return "gpt_neox"
    if arch["pos_emb"] == "learned" and not arch["gpt_j_residual"]:
        return "gpt2"
    return "kerple"


def _layer_count(state: dict[str, torch.Tensor]) -> int:
    return len({split_key(n)[0] for n in state if n.endswith("attention.query_key_value.weight")})


def _neox_tensors(state: dict[str, torch.Tensor], keep_positional: bool) -> dict[str, torch.Tensor]:
    layers = _layer_count(state)
    out: dict[str, torch.Tensor] = {"gpt_neox.embed_in.weight": state["sequential.0.word_embeddings.weight"]}
    for i in range(layers):
        for key in LAYER_KEYS:
            out[f"gpt_neox.layers.{i}.{key}"] = state[f"sequential.{i + 2}.{key}"]
    for part in ("weight", "bias"):
        out[f"gpt_neox.final_layer_norm.{part}"] = state[f"sequential.{layers + 3}.norm.{part}"]
    head = f"sequential.{layers + 4}.final_linear.weight"
    if head in state:
        out["embed_out.weight"] = state[head]
    if keep_positional:
        for name, tensor in state.items():
            index, key = split_key(name)
            if index == 0 and key != "word_embeddings.weight":
                out[f"{POSITIONAL_PREFIX}embedding.{key}"] = tensor
            elif index == 2 and is_positional(key):
                out[f"{POSITIONAL_PREFIX}{key}"] = tensor
    return out


def _qkv_blocks(tensor: torch.Tensor, heads: int, to_blocks: bool) -> torch.Tensor:
    """Per-head interleaved rows ``[H, 3, d]`` <-> q/k/v blocks ``[3, H, d]`` (dim 0)."""
    rest = tensor.shape[1:]
    head_dim = tensor.shape[0] // (3 * heads)
    shape = (heads, 3, head_dim) if to_blocks else (3, heads, head_dim)
    return tensor.reshape(*shape, *rest).transpose(0, 1).reshape(tensor.shape)


def _gpt2_tensors(state: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    layers = _layer_count(state)
    out = {
        "transformer.wte.weight": state["sequential.0.word_embeddings.weight"],
        "transformer.wpe.weight": state["sequential.0.position_embeddings.weight"],
    }
    for i in range(layers):
        prefix = f"sequential.{i + 2}."
        for key, name, transpose in _GPT2_LAYER:
            tensor = state[prefix + key]
            out[f"transformer.h.{i}.{name}"] = tensor.t() if transpose else tensor
        qkv_w = _qkv_blocks(state[prefix + "attention.query_key_value.weight"], heads, to_blocks=True)
        out[f"transformer.h.{i}.attn.c_attn.weight"] = qkv_w.t()
        out[f"transformer.h.{i}.attn.c_attn.bias"] = _qkv_blocks(state[prefix + "attention.query_key_value.bias"], heads, True)
    for part in ("weight", "bias"):
        out[f"transformer.ln_f.{part}"] = state[f"sequential.{layers + 3}.norm.{part}"]
    head = f"sequential.{layers + 4}.final_linear.weight"
    if head in state:
        out["lm_head.weight"] = state[head]
    return out


def _hf_config(target: str, config: dict[str, Any], state: dict[str, torch.Tensor], eos: int | None) -> dict[str, Any]:
    arch = _architecture(config)
    layers = _layer_count(state)
    vocab = int(state["sequential.0.word_embeddings.weight"].shape[0])
    tied = f"sequential.{layers + 4}.final_linear.weight" not in state
    dtype = str(state["sequential.0.word_embeddings.weight"].dtype).replace("torch.", "")
    common = {"vocab_size": vocab, "tie_word_embeddings": tied, "dtype": dtype, "torch_dtype": dtype}
    if eos is not None:
        common.update(bos_token_id=eos, eos_token_id=eos)
    if target == "gpt2":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_embd": arch["hidden_size"],
            "n_layer": layers,
            "n_head": arch["num_attention_heads"],
            "n_inner": 4 * arch["hidden_size"],
            "n_positions": int(state["sequential.0.position_embeddings.weight"].shape[0]),
            "activation_function": "gelu",
            "layer_norm_epsilon": arch["layernorm_epsilon"],
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            **common,
        }
    rotary_pct = 0.0 if arch["pos_emb"] == "none" else arch["rotary_pct"]
    neox = {
        "architectures": ["GPTNeoXForCausalLM"] if target == "gpt_neox" else ["KerpleForCausalLM"],
        "model_type": "gpt_neox" if target == "gpt_neox" else "kerple",
        "hidden_size": arch["hidden_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": arch["num_attention_heads"],
        "intermediate_size": 4 * arch["hidden_size"],
        "hidden_act": "gelu",
        "max_position_embeddings": arch["max_positions"],
        "layer_norm_eps": arch["layernorm_epsilon"],
        "use_parallel_residual": arch["gpt_j_residual"],
        "attention_bias": True,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        **common,
    }
    if target == "gpt_neox":
        neox["rotary_pct"] = rotary_pct
        neox["rotary_emb_base"] = arch["rotary_emb_base"]
        neox["rope_parameters"] = {"rope_type": "default", "rope_theta": arch["rotary_emb_base"], "partial_rotary_factor": rotary_pct}
    else:
        neox["positional_embedding"] = arch["pos_emb"]
    return neox


def _copy_tokenizer(files: Iterable[str | Path], folder: Path, max_length: int) -> None:
    names = {}
    for source in files:
        source = Path(source)
        if not source.is_file():
            raise CheckpointError(f"tokenizer file {source} does not exist")
        target = "tokenizer.json" if source.suffix == ".json" and source.name != "vocab.json" else source.name
        if source.name.endswith("vocab.json"):
            target = "vocab.json"
        elif source.suffix == ".txt":
            target = "merges.txt"
        shutil.copyfile(source, folder / target)
        names[target] = True
    if "tokenizer.json" in names:
        tok = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length}
    elif "vocab.json" in names and "merges.txt" in names:
        tok = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length, "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    else:
        return
    (folder / "tokenizer_config.json").write_text(json.dumps(tok, indent=1) + "\n")


def export_huggingface(
    state: dict[str, torch.Tensor],
    config: dict[str, Any],
    out_dir: str | Path,
    *,
    target: str | None = None,
    tokenizer_files: Iterable[str | Path] = (),
    eos_token_id: int | None = None,
) -> Path:
    """Write ``state`` (full, ``sequential.N.*``) as a Hugging Face folder at ``out_dir``.

    ``config`` is the flat kerple config (``Config.to_dict()`` plus ``padded_vocab_size``);
    ``target`` defaults to :func:`target_for`. The folder is assembled under a temporary name and
    renamed into place; an existing non-empty ``out_dir`` is refused.
    """
    from safetensors.torch import save_file

    target = target or target_for(config)
    allowed = target_for(config)
    if target != "kerple" and target != allowed:
        raise CheckpointError(
            f"a {config.get('pos_emb')!r} model cannot be exported as {target!r} (it maps to {allowed!r}); "
            "see docs/interop.md"
        )
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out} exists and is not empty; choose a new output folder")
    required = "sequential.0.position_embeddings.weight" if target == "gpt2" else "sequential.0.word_embeddings.weight"
    if required not in state:
        raise CheckpointError(
            f"the weights have no {required!r}, so they are not a {config.get('pos_emb')!r} model as the config says; "
            "pass the config the checkpoint was trained with"
        )
    if target == "gpt2":
        tensors = _gpt2_tensors(state, int(config["num_attention_heads"]))
    else:
        tensors = _neox_tensors(state, keep_positional=target == "kerple")
    tensors = {name: t.detach().cpu().contiguous().clone() for name, t in tensors.items()}
    hf = _hf_config(target, config, state, eos_token_id)
    hf["kerple"] = {"format": 1, "target": target, "config": config}
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    try:
        save_file(tensors, str(temporary / "model.safetensors"), metadata={"format": "pt"})
        (temporary / "config.json").write_text(json.dumps(hf, indent=1, default=str) + "\n")
        _copy_tokenizer(tokenizer_files, temporary, _architecture(config)["max_positions"])
        if out.exists():
            out.rmdir()
        os.replace(temporary, out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return out


def _config_from_hf(hf: dict[str, Any]) -> dict[str, Any]:
    """A flat kerple config dict for a folder exported elsewhere (GPTNeoX or GPT-2 fields)."""
    if hf.get("model_type") == "gpt2":
        hidden = int(hf["n_embd"])
        return {
            "num_layers": int(hf["n_layer"]),
            "hidden_size": hidden,
            "num_attention_heads": int(hf["n_head"]),
            "vocab_size": int(hf["vocab_size"]),
            "make_vocab_size_divisible_by": 1,
            "seq_length": int(hf["n_positions"]),
            "max_position_embeddings": int(hf["n_positions"]),
            "pos_emb": "learned",
            "layernorm_epsilon": float(hf.get("layer_norm_epsilon", 1e-5)),
            "no_weight_tying": not hf.get("tie_word_embeddings", True),
            "gpt_j_residual": False,
        }
    rope = hf.get("rope_parameters") or {}
    pct = float(rope.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
    return {
        "num_layers": int(hf["num_hidden_layers"]),
        "hidden_size": int(hf["hidden_size"]),
        "num_attention_heads": int(hf["num_attention_heads"]),
        "vocab_size": int(hf["vocab_size"]),
        "make_vocab_size_divisible_by": 1,
        "seq_length": int(hf.get("max_position_embeddings", 2048)),
        "pos_emb": "none" if pct == 0.0 else "rotary",
        "rotary_pct": pct if pct > 0 else 1.0,
        "rotary_emb_base": float(rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0))),
        "layernorm_epsilon": float(hf.get("layer_norm_eps", 1e-5)),
        "gpt_j_residual": bool(hf.get("use_parallel_residual", True)),
        "no_weight_tying": not hf.get("tie_word_embeddings", False),
    }


def import_huggingface(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a Hugging Face folder (exported here, or a stock GPTNeoX / GPT-2 one).

    Returns the full state dict in ``sequential.N.*`` naming (positional tensors copied into every
    layer) and a flat kerple config dict (``load_config([], overrides=...)`` accepts it; for
    folders exported here it is the exporting run's config).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    for required in ("config.json", "model.safetensors"):
        if not (folder / required).is_file():
            raise CheckpointError(f"{folder} has no {required}; not a Hugging Face export")
    hf = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    info = hf.get("kerple") or {}
    config = dict(info.get("config") or _config_from_hf(hf))
    config.pop("padded_vocab_size", None)  # derived; recomputed by load_config
    if hf.get("model_type") == "gpt2":
        return _from_gpt2(tensors, int(hf["n_head"])), config
    if hf.get("model_type") not in ("gpt_neox", "kerple"):
        raise CheckpointError(f"{folder}: model_type {hf.get('model_type')!r} is not gpt_neox, gpt2 or kerple")
    state = _from_neox(tensors)
    if config.get("pos_emb") == "rotary":
        _add_inv_freq(state, config)
    return state, config


def _add_inv_freq(state: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """Stock HF folders do not store the rotary frequencies; recompute them (docs/reference-format.md §3)."""
    head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
    ndims = int(head_dim * float(config.get("rotary_pct", 1.0)))
    exponents = torch.arange(0, ndims, 2, dtype=torch.float32) / ndims
    inv_freq = 1.0 / (float(config.get("rotary_emb_base", 10000.0)) ** exponents)
    for index in sorted({split_key(n)[0] for n in state if n.endswith("attention.query_key_value.weight")}):
        state.setdefault(f"sequential.{index}.attention.rotary_emb.inv_freq", inv_freq)


def _from_neox(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    layers = len({name.split(".")[2] for name in tensors if name.startswith("gpt_neox.layers.")})
    state = {"sequential.0.word_embeddings.weight": tensors["gpt_neox.embed_in.weight"]}
    for i in range(layers):
        for key in LAYER_KEYS:
            state[f"sequential.{i + 2}.{key}"] = tensors[f"gpt_neox.layers.{i}.{key}"]
    for part in ("weight", "bias"):
        state[f"sequential.{layers + 3}.norm.{part}"] = tensors[f"gpt_neox.final_layer_norm.{part}"]
    head = tensors.get("embed_out.weight", tensors.get("lm_head.weight"))
    if head is not None:
        state[f"sequential.{layers + 4}.final_linear.weight"] = head
    for name, tensor in tensors.items():
        if not name.startswith(POSITIONAL_PREFIX):
            continue
        key = name[len(POSITIONAL_PREFIX) :]
        if key.startswith("embedding."):
            state[f"sequential.0.{key[len('embedding.') :]}"] = tensor
        else:
            for i in range(layers):
                state[f"sequential.{i + 2}.{key}"] = tensor
    return state


def _from_gpt2(tensors: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    tensors = {name.removeprefix("transformer."): t for name, t in tensors.items()}
    layers = len({name.split(".")[1] for name in tensors if name.startswith("h.")})
    state = {
        "sequential.0.word_embeddings.weight": tensors["wte.weight"],
        "sequential.0.position_embeddings.weight": tensors["wpe.weight"],
    }
    for i in range(layers):
        prefix = f"sequential.{i + 2}."
        for key, name, transpose in _GPT2_LAYER:
            tensor = tensors[f"h.{i}.{name}"]
            state[prefix + key] = tensor.t().contiguous() if transpose else tensor
        state[prefix + "attention.query_key_value.weight"] = _qkv_blocks(tensors[f"h.{i}.attn.c_attn.weight"].t(), heads, False)
        state[prefix + "attention.query_key_value.bias"] = _qkv_blocks(tensors[f"h.{i}.attn.c_attn.bias"], heads, False)
    for part in ("weight", "bias"):
        state[f"sequential.{layers + 3}.norm.{part}"] = tensors[f"ln_f.{part}"]
    if "lm_head.weight" in tensors:
        state[f"sequential.{layers + 4}.final_linear.weight"] = tensors["lm_head.weight"]
    return state
