"""Hugging Face-style folders: ``model.safetensors`` + ``config.json`` + tokenizer files, both ways.

Which class an export loads in (see docs/interop.md):

* ``gpt_neox`` - :class:`transformers.GPTNeoXForCausalLM`, for ``rotary`` (``rotary_pct``,
  ``rotary_emb_base`` and its run-time options: :func:`kerple.positional.rotary.gpt_neox_config`) and
  ``none`` (NoPE = rotary with ``partial_rotary_factor`` 0), LayerNorm, exact GELU, either residual
  form (``use_parallel_residual`` = ``gpt_j_residual``). The fused QKV of HF GPTNeoX is laid out per
  head exactly as GPT-NeoX's, so tensors are renamed, not permuted.
* ``gpt2`` - :class:`transformers.GPT2LMHeadModel`, for ``learned`` absolute positions (HF GPTNeoX
  has no learned position table) with the sequential residual: GPT-2 is the same pre-LN block, so
  the weights map exactly (Conv1D stores ``W^T``; its ``c_attn`` wants q, k, v blocks, not
  per-head interleaving, so those rows are permuted).
* ``kerple`` - every other embedding (KERPLE, ALiBi, T5, Sandwich, Gaussian-like, sinusoidal), any
  other norm/activation and any attention window: ``KerpleForCausalLM``, whose code the folder
  carries (:mod:`kerple.checkpoint.hf_kerple`), so ``transformers`` loads it with
  ``trust_remote_code=True`` and no kerple installed. GPTNeoX tensor names, plus the positional
  tensors once under ``gpt_neox.positional.<key>``.

Every export stores the full kerple config under ``config.json["kerple"]`` so an import restores it
exactly; folders from elsewhere (e.g. Pythia) are imported from the standard fields. Both directions
work on a :class:`kerple.model.GPTModel`'s own state-dict names. Folders of the first format (before
``KerpleForCausalLM``) kept the positional tensors under GPT-NeoX's per-layer key
(``kerple_positional.attention.rpe.bias_p``) or ``kerple_positional.embedding.<key>``; they still import.
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
from kerple.checkpoint.hf_kerple import export_note, kerple_config, write_remote_code
from kerple.checkpoint.neox_layout import positional_module_key
from kerple.positional.rotary import from_gpt_neox_config, gpt_neox_config

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
EXPORT_FORMAT = 2  # config.json["kerple"]["format"]; 1 named the positional tensors as below
FORMAT1_POSITIONAL = "kerple_positional."
FORMAT1_INPUT = "embedding."
# (model prefix, GPTNeoX-layout prefix): the weights' names in gpt_neox and kerple folders
_NEOX_PREFIXES = (
    ("embedding.word_embeddings.", "gpt_neox.embed_in."),
    ("layers.", "gpt_neox.layers."),
    ("final_norm.", "gpt_neox.final_layer_norm."),
    ("lm_head.", "embed_out."),
    ("positional.", "gpt_neox.positional."),
)
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
        "attention_window": config.get("attention_window"),
    }


def target_for(config: dict[str, Any]) -> str:
    """``gpt_neox``, ``gpt2`` or ``kerple``: the class a model with ``config`` exports to."""
    arch = _architecture(config)
    if arch["norm"] != "layernorm" or arch["activation"] != "gelu" or arch["attention_window"] is not None:
        return "kerple"
    if arch["pos_emb"] in ("rotary", "none"):
        return "gpt_neox"
    if arch["pos_emb"] == "learned" and not arch["gpt_j_residual"]:
        return "gpt2"
    return "kerple"


def _layer_count(state: dict[str, torch.Tensor]) -> int:
    return len({name.split(".")[1] for name in state if name.startswith("layers.")})


def _rename(name: str, pairs: Iterable[tuple[str, str]]) -> str | None:
    """``name`` with the first matching prefix replaced (``pairs``: (from, to)); ``None`` if none matches."""
    for old, new in pairs:
        if name.startswith(old):
            return new + name[len(old) :]
    return None


def _neox_tensors(state: dict[str, torch.Tensor], with_positional: bool) -> dict[str, torch.Tensor]:
    """GPTNeoX-layout names for a model state dict; the positional tensors only ``with_positional`` (``kerple``)."""
    out = {}
    for name, tensor in state.items():
        hf_name = _rename(name, _NEOX_PREFIXES)
        if hf_name is None:
            raise CheckpointError(f"model tensor {name!r} has no place in a Hugging Face GPTNeoX-layout folder")
        if with_positional or not name.startswith("positional."):
            out[hf_name] = tensor
    return out


def _qkv_blocks(tensor: torch.Tensor, heads: int, to_blocks: bool) -> torch.Tensor:
    """Per-head interleaved rows ``[H, 3, d]`` <-> q/k/v blocks ``[3, H, d]`` (dim 0)."""
    rest = tensor.shape[1:]
    head_dim = tensor.shape[0] // (3 * heads)
    shape = (heads, 3, head_dim) if to_blocks else (3, heads, head_dim)
    return tensor.reshape(*shape, *rest).transpose(0, 1).reshape(tensor.shape)


def _gpt2_names(layers: int) -> list[tuple[str, str, bool]]:
    """(model key, GPT-2 key, transposed for Conv1D) of every tensor but the fused QKV."""
    names = [
        ("embedding.word_embeddings.weight", "transformer.wte.weight", False),
        ("positional.position_embeddings.weight", "transformer.wpe.weight", False),
        ("final_norm.weight", "transformer.ln_f.weight", False),
        ("final_norm.bias", "transformer.ln_f.bias", False),
        ("lm_head.weight", "lm_head.weight", False),
    ]
    for i in range(layers):
        names += [(f"layers.{i}.{key}", f"transformer.h.{i}.{name}", transpose) for key, name, transpose in _GPT2_LAYER]
    return names


def _gpt2_tensors(state: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    layers = _layer_count(state)
    out = {name: state[key].t() if transpose else state[key] for key, name, transpose in _gpt2_names(layers) if key in state}
    for i in range(layers):
        qkv = f"layers.{i}.attention.query_key_value."
        out[f"transformer.h.{i}.attn.c_attn.weight"] = _qkv_blocks(state[qkv + "weight"], heads, to_blocks=True).t()
        out[f"transformer.h.{i}.attn.c_attn.bias"] = _qkv_blocks(state[qkv + "bias"], heads, to_blocks=True)
    return out


def _hf_config(target: str, config: dict[str, Any], state: dict[str, torch.Tensor]) -> dict[str, Any]:
    arch = _architecture(config)
    layers = _layer_count(state)
    embedding = state["embedding.word_embeddings.weight"]
    tied = "lm_head.weight" not in state
    dtype = str(embedding.dtype).replace("torch.", "")
    # token ids are set from the tokenizer when there is one, never left to a class's defaults
    common = {"vocab_size": int(embedding.shape[0]), "tie_word_embeddings": tied, "dtype": dtype, "torch_dtype": dtype,
              "bos_token_id": None, "eos_token_id": None}
    if target == "gpt2":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_embd": arch["hidden_size"],
            "n_layer": layers,
            "n_head": arch["num_attention_heads"],
            "n_inner": 4 * arch["hidden_size"],
            "n_positions": int(state["positional.position_embeddings.weight"].shape[0]),
            "activation_function": "gelu",
            "layer_norm_epsilon": arch["layernorm_epsilon"],
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            **common,
        }
    if target == "kerple":
        return kerple_config(config, state, common)
    rotary_pct = 0.0 if arch["pos_emb"] == "none" else arch["rotary_pct"]
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "hidden_size": arch["hidden_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": arch["num_attention_heads"],
        "intermediate_size": 4 * arch["hidden_size"],
        "hidden_act": "gelu",
        "layer_norm_eps": arch["layernorm_epsilon"],
        "use_parallel_residual": arch["gpt_j_residual"],
        "attention_bias": True,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        **gpt_neox_config(config, rotary_pct=rotary_pct, max_positions=arch["max_positions"]),
        **common,
    }


def _copy_tokenizer(files: Iterable[str | Path], folder: Path, max_length: int | None) -> int | None:
    """Copy the tokenizer files into ``folder`` with a ``tokenizer_config.json`` naming the
    end-of-document token as ``eos_token``, ``bos_token`` and ``pad_token`` (so ``padding=True``
    works; the mask hides it); returns its id (``None``: no tokenizer). ``model_max_length`` is
    ``max_length``, left unset (transformers' "no limit") for a model without a position table."""
    from kerple.data.tokenizers import GPT2BPETokenizer, HFTokenizer

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
        kerple_tokenizer = HFTokenizer(folder / "tokenizer.json")
        tok = {"tokenizer_class": "PreTrainedTokenizerFast"}
    elif "vocab.json" in names and "merges.txt" in names:
        kerple_tokenizer = GPT2BPETokenizer(folder / "vocab.json", folder / "merges.txt")
        tok = {"tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>"}
    else:
        return None
    if max_length:
        tok["model_max_length"] = max_length
    eod = kerple_tokenizer.eod
    tok["eos_token"] = tok["bos_token"] = tok["pad_token"] = kerple_tokenizer.backend.id_to_token(eod)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok, indent=1) + "\n")
    return eod


def export_huggingface(
    state: dict[str, torch.Tensor],
    config: dict[str, Any],
    out_dir: str | Path,
    *,
    target: str | None = None,
    tokenizer_files: Iterable[str | Path] = (),
    eos_token_id: int | None = None,
    iteration: int | None = None,
) -> Path:
    """Write the model state dict ``state`` (a whole :class:`~kerple.model.GPTModel`'s names) as a
    Hugging Face folder at ``out_dir``.

    ``config`` is the flat kerple config (``Config.to_dict()`` plus ``padded_vocab_size``);
    ``target`` defaults to :func:`target_for`. ``eos_token_id`` (``bos_token_id`` too) defaults to
    the tokenizer's end-of-document id. ``iteration``, the training step of the weights, is recorded
    (:func:`exported_iteration`). The folder is assembled under a temporary name and renamed into
    place; an existing non-empty ``out_dir`` is refused.
    """
    from safetensors.torch import save_file

    allowed = target_for(config)
    target = target or allowed
    if target != "kerple" and target != allowed:
        raise CheckpointError(
            f"a {config.get('pos_emb')!r} model cannot be exported as {target!r} (it maps to {allowed!r}); "
            "see docs/interop.md"
        )
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out} exists and is not empty; choose a new output folder")
    required = "positional.position_embeddings.weight" if target == "gpt2" else "embedding.word_embeddings.weight"
    if required not in state:
        raise CheckpointError(
            f"the weights have no {required!r}, so they are not a {config.get('pos_emb')!r} model as the config says; "
            "pass the config the checkpoint was trained with"
        )
    if target == "gpt2":
        tensors = _gpt2_tensors(state, int(config["num_attention_heads"]))
    else:
        tensors = _neox_tensors(state, with_positional=target == "kerple")
    tensors = {name: t.detach().cpu().contiguous().clone() for name, t in tensors.items()}
    hf = _hf_config(target, config, state)
    hf["kerple"] = {"format": EXPORT_FORMAT, "target": target, "config": config, "iteration": iteration}
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    try:
        save_file(tensors, str(temporary / "model.safetensors"), metadata={"format": "pt"})
        # a learned table (GPT-2's n_positions, KerpleForCausalLM's max_position_embeddings) limits the
        # input; rotary and the relative biases read longer inputs than they were trained on
        table = hf.get("n_positions") or (hf.get("max_position_embeddings") if target == "kerple" else None)
        eod = _copy_tokenizer(tokenizer_files, temporary, table)
        eos = eos_token_id if eos_token_id is not None else eod
        if eos is not None and eos < hf["vocab_size"]:
            hf.update(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
        (temporary / "config.json").write_text(json.dumps(hf, indent=1, default=str) + "\n")
        if target == "kerple":
            write_remote_code(temporary)
        readable_like_a_new_folder(temporary)
        if out.exists():
            out.rmdir()
        os.replace(temporary, out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return out


def readable_like_a_new_folder(folder: Path) -> None:
    """Give ``folder`` and its files the modes ``mkdir`` and ``open`` would (0777 and 0666 less the
    umask): it was made by ``mkdtemp`` (0700) and safetensors writes 0600, so an export was readable
    by its owner alone."""
    mask = os.umask(0o022)
    os.umask(mask)
    for path in folder.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
    os.chmod(folder, 0o777 & ~mask)


def describe_export(config: dict[str, Any], target: str | None = None) -> str:
    """The export log's line: the class a folder of ``config``'s model loads in, and why (``target``
    as for :func:`export_huggingface`)."""
    chosen = target_for(config)
    return export_note(config, target or chosen, chosen)


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
    return {
        "num_layers": int(hf["num_hidden_layers"]),
        "hidden_size": int(hf["hidden_size"]),
        "num_attention_heads": int(hf["num_attention_heads"]),
        "vocab_size": int(hf["vocab_size"]),
        "make_vocab_size_divisible_by": 1,
        "seq_length": int(hf.get("max_position_embeddings", 2048)),
        **from_gpt_neox_config(hf),
        "layernorm_epsilon": float(hf.get("layer_norm_eps", 1e-5)),
        "gpt_j_residual": bool(hf.get("use_parallel_residual", True)),
        "no_weight_tying": not hf.get("tie_word_embeddings", False),
    }


def exported_config(folder: str | Path) -> dict[str, Any]:
    """The flat kerple config of a Hugging Face folder: the exporting run's (an export made here), or
    one read from the standard fields (a stock GPTNeoX / GPT-2 folder)."""
    hf = json.loads((Path(folder) / "config.json").read_text())
    return dict((hf.get("kerple") or {}).get("config") or _config_from_hf(hf))


def exported_iteration(folder: str | Path) -> int | None:
    """The training step of the weights of a folder exported here (``None``: not recorded, or from elsewhere)."""
    step = (json.loads((Path(folder) / "config.json").read_text()).get("kerple") or {}).get("iteration")
    return int(step) if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def import_huggingface(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a Hugging Face folder (exported here, or a stock GPTNeoX / GPT-2 one).

    Returns the state dict under a :class:`~kerple.model.GPTModel`'s names and a flat kerple config dict (``load_config([], overrides=...)`` accepts it; for
    folders exported here it is the exporting run's config).
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    for required in ("config.json", "model.safetensors"):
        if not (folder / required).is_file():
            raise CheckpointError(f"{folder} has no {required}; not a Hugging Face export")
    hf = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    config = exported_config(folder)
    config.pop("padded_vocab_size", None)  # derived; recomputed by load_config
    if hf.get("model_type") == "gpt2":
        return _from_gpt2(tensors, int(hf["n_head"])), config
    if hf.get("model_type") not in ("gpt_neox", "kerple"):
        raise CheckpointError(f"{folder}: model_type {hf.get('model_type')!r} is not gpt_neox, gpt2 or kerple")
    state = _from_neox(tensors, stock=hf.get("model_type") == "gpt_neox")
    if config.get("pos_emb") == "rotary":
        _add_inv_freq(state, config)
    return state, config


def _add_inv_freq(state: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """Stock HF folders do not store the rotary frequencies; recompute them (docs/reference-format.md §3)."""
    head_dim = int(config["hidden_size"]) // int(config["num_attention_heads"])
    ndims = int(head_dim * float(config.get("rotary_pct", 1.0)))
    exponents = torch.arange(0, ndims, 2, dtype=torch.float32) / ndims
    state.setdefault("positional.inv_freq", 1.0 / (float(config.get("rotary_emb_base", 10000.0)) ** exponents))


def _model_name(name: str, stock: bool) -> str | None:
    """The model's name for a GPTNeoX-layout tensor; ``None`` for what a stock folder holds beyond
    the weights (``attention.bias`` masks, ``rotary_emb.inv_freq``, recomputed on import)."""
    if name == "lm_head.weight":  # transformers 5's name of embed_out
        return name
    if name.startswith(FORMAT1_POSITIONAL + FORMAT1_INPUT):
        return "positional." + name[len(FORMAT1_POSITIONAL + FORMAT1_INPUT) :]
    if name.startswith(FORMAT1_POSITIONAL):  # kerple_positional.attention.<module>.<key>
        return "positional." + positional_module_key(name[len(FORMAT1_POSITIONAL) :])
    internal = _rename(name, [(new, old) for old, new in _NEOX_PREFIXES])
    if stock and internal is not None and internal.startswith("layers."):
        return internal if internal.split(".", 2)[2] in LAYER_KEYS else None
    return internal


def _from_neox(tensors: dict[str, torch.Tensor], stock: bool) -> dict[str, torch.Tensor]:
    """A GPTNeoX-layout folder's tensors under the model's names (a ``stock`` folder's weights only)."""
    state = {}
    for name, tensor in tensors.items():
        internal = _model_name(name, stock)
        if internal is not None:
            state[internal] = tensor
    return state


def _from_gpt2(tensors: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    tensors = {name if name == "lm_head.weight" else "transformer." + name.removeprefix("transformer."): t for name, t in tensors.items()}
    layers = len({name.split(".")[2] for name in tensors if name.startswith("transformer.h.")})
    state = {
        key: tensors[name].t().contiguous() if transpose else tensors[name]
        for key, name, transpose in _gpt2_names(layers)
        if name in tensors
    }
    for i in range(layers):
        block = f"transformer.h.{i}.attn.c_attn."
        state[f"layers.{i}.attention.query_key_value.weight"] = _qkv_blocks(tensors[block + "weight"].t(), heads, False)
        state[f"layers.{i}.attention.query_key_value.bias"] = _qkv_blocks(tensors[block + "bias"], heads, False)
    return state
