"""What a checkpoint says about the model it holds, and the one check against a config.

:func:`architecture_args` is the ``args`` record this project writes into
``mp_rank_MM_model_states.pt`` (the reference's fields, docs/reference-format.md §6, plus ``pos_emb``
and the positional options). :func:`state_architecture` reads the architecture of a set of weights:
shapes from the tensors themselves, the rest as recorded (``args``, ``configs/*.yml``, a Hugging
Face export's config). :func:`check_architecture` compares that with a config and names **every**
field that differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kerple.checkpoint.errors import ArchitectureMismatchError
from kerple.checkpoint.runtime_options import finetuned_from, runtime_args
from kerple.model import families

# The reference's ``args`` fields (docs/reference-format.md §6).
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
# (name, config section) of every field this project records in ``args``, in the record's order.
_RECORDED_ARGS: tuple[tuple[str, str], ...] = (
    ("num_layers", "model"),
    ("hidden_size", "model"),
    ("num_attention_heads", "model"),
    ("max_position_embeddings", "model"),
    ("make_vocab_size_divisible_by", "model"),
    ("padded_vocab_size", "model"),
    ("tokenizer_type", "data"),
    ("model_parallel_size", "parallelism"),
    ("pos_emb", "positional"),
    ("norm", "model"),
    ("activation", "model"),
    ("gpt_j_residual", "model"),
    ("no_weight_tying", "model"),
    ("seq_length", "model"),
)
# Model fields that change what the weights mean without changing their shapes: these, and every
# model family's recorded arguments (kerple.model.family.ModelFamily.recorded_args).
_SHAPE_FREE_ARGS: tuple[str, ...] = ("gpt_j_residual", "norm", "activation")


def model_options() -> tuple[str, ...]:
    """The ``model`` fields a checkpoint's architecture check compares beyond the shapes."""
    recorded = [name for name in families.names() for name in families.family(name).recorded_args]
    return tuple(dict.fromkeys((*_SHAPE_FREE_ARGS, *recorded)))


def positional_option_names() -> tuple[str, ...]:
    """The positional embedding options a checkpoint records (``args.positional_options``), the
    architecture check compares and the converter carries: every option the families declare."""
    from kerple import positional

    return positional.option_names()


def _plain(value: Any) -> Any:
    """Config values as plain Python types (safe for ``weights_only`` loading)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def architecture_args(cfg: Any) -> dict[str, Any]:
    """The ``args`` record of ``mp_rank_MM_model_states.pt`` for the config ``cfg`` (with the run-time
    options among the positional ones, and ``finetuned_from``: :mod:`kerple.checkpoint.runtime_options`)."""
    args = {name: _plain(getattr(getattr(cfg, section), name)) for name, section in _RECORDED_ARGS}
    args.update({name: _plain(getattr(cfg.model, name)) for name in families.family_of(cfg).recorded_args})
    args["positional_options"] = {name: _plain(getattr(cfg.positional, name)) for name in positional_option_names()}
    args.update({name: _plain(value) for name, value in runtime_args(cfg).items()})
    return with_origin(args, finetuned_from(cfg))


def with_origin(args: dict[str, Any], origin: str | None) -> dict[str, Any]:
    """``args`` with ``finetuned_from: origin`` when the run is a fine-tune (a record without the key
    is a run trained from scratch, as every record written before the key was)."""
    return {**args, "finetuned_from": origin} if origin else args


def state_architecture(state: dict[str, torch.Tensor], recorded: dict[str, Any], pos_emb: str | None) -> dict[str, Any]:
    """Architecture fields of the weights ``state`` (the model's names): shapes from the tensors, the
    options from ``recorded`` (flat keys; ``positional_options`` is unpacked), ``pos_emb`` as given.
    A recorded ``arch`` (model family) is compared, and an argument its family records only since
    a later version takes the value it had before (``legacy_args``); with none recorded (GPT-NeoX,
    Hugging Face, tests' minimal records) the family is left to the tensors' names and shapes."""
    recorded = {**recorded, **(recorded.get("positional_options") or {})}
    if recorded.get("arch") is not None:
        recorded = {**_recorded_family(recorded).legacy_args, **{k: v for k, v in recorded.items() if v is not None}}
    arch: dict[str, Any] = {"num_layers": len({name.split(".")[1] for name in state if name.startswith("layers.")})}
    embedding = state.get("embedding.word_embeddings.weight")
    if embedding is not None:
        arch["padded_vocab_size"], arch["hidden_size"] = int(embedding.shape[0]), int(embedding.shape[1])
    if recorded.get("num_attention_heads") is not None:
        arch["num_attention_heads"] = int(recorded["num_attention_heads"])
    arch["no_weight_tying"] = "lm_head.weight" in state
    table = state.get("positional.position_embeddings.weight")
    if table is not None:
        arch["max_position_embeddings"] = int(table.shape[0])
    if pos_emb is not None:
        arch["pos_emb"] = pos_emb
    for name in model_options() + positional_option_names():
        if recorded.get(name) is not None:
            arch[name] = recorded[name]
    return arch


def _recorded_family(recorded: dict[str, Any]) -> Any:
    """The :class:`~kerple.model.family.ModelFamily` a checkpoint's record names."""
    name = str(recorded.get("arch") or "gpt")
    try:
        return families.family(name)
    except KeyError as error:
        raise ArchitectureMismatchError(f"the checkpoint records {error.args[0]}", ["arch"]) from None


def checkpoint_architecture(ckpt: Any) -> dict[str, Any]:
    """:func:`state_architecture` of a :class:`~kerple.checkpoint.reference.LoadedCheckpoint`."""
    return state_architecture(ckpt.model_state(), {**ckpt.config, **ckpt.args}, ckpt.pos_emb)


def _wanted(cfg: Any) -> dict[str, Any]:
    model = cfg.model
    family = families.family_of(cfg)
    wanted: dict[str, Any] = {
        "arch": family.name,
        "num_layers": getattr(model, family.layer_count_key),  # the layer modules the weights hold
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "padded_vocab_size": model.padded_vocab_size,
        "no_weight_tying": model.no_weight_tying,
        "pos_emb": cfg.positional.pos_emb,
        "max_position_embeddings": model.max_position_embeddings or model.seq_length,
    }
    wanted.update({name: getattr(model, name) for name in model_options()})
    wanted.update({name: getattr(cfg.positional, name) for name in positional_option_names()})
    return wanted


def _same(value: Any, want: Any) -> bool:
    if isinstance(value, (int, float)) and isinstance(want, (int, float)):
        return float(value) == float(want)
    return value == want


def check_architecture(arch: dict[str, Any], cfg: Any, source: str | Path, *, model_parallel_size: int = 1) -> None:
    """Raise :class:`ArchitectureMismatchError` naming every field where ``arch`` and ``cfg`` differ
    (the run-time options, :func:`kerple.positional.runtime_option_names`, may differ).

    ``arch`` comes from :func:`state_architecture` or :func:`checkpoint_architecture`;
    ``model_parallel_size`` (of the checkpoint) explains a padded-vocabulary mismatch.
    """
    from kerple import positional

    wanted = _wanted(cfg)
    problems: list[str] = []
    fields: list[str] = []
    for name, value in arch.items():
        want = wanted.get(name)
        if (want is None and name != "pos_emb") or _same(value, want) or name in positional.runtime_option_names():
            continue
        fields.append(name)
        hint = ""
        if name == "padded_vocab_size" and model_parallel_size > 1:
            hint = (
                f" (the checkpoint was padded for model_parallel_size {model_parallel_size}: set "
                f"make_vocab_size_divisible_by so that vocab_size pads to {value})"
            )
        elif name == "padded_vocab_size" and cfg.provenance("model.vocab_size")[0] == "<default>":
            hint = (f" (no file sets vocab_size, so it is the tokenizer's, {cfg.model.vocab_size}; a checkpoint "
                    "trained when an unset vocab_size meant 50257 loads with vocab_size: 50257)")
        elif name == "no_weight_tying":
            hint = " (the checkpoint " + ("has an untied head final_linear)" if value else "ties the head to word_embeddings)")
        elif families.family_of(cfg).legacy_args.get(name) == value:
            hint = f" (written before {name} was recorded: set {name}: {value} to load it)"
        problems.append(f"{name}: checkpoint {value!r} vs config {want!r}{hint}")
    if problems:
        raise ArchitectureMismatchError(
            f"checkpoint {source} does not match the config: {'; '.join(problems)}. Use the config the "
            f"checkpoint was trained with (its configs/ folder) or override these keys.",
            fields,
        )
