"""Load-time rules for GPT-NeoX's keys that kerple does not implement.

Run by :func:`kerple.config.validate.finalize`: GPT-NeoX features that change the model or the
training and that kerple lacks are refused with one line naming the feature (the table of
:mod:`kerple.config.neox_only` plus the rules below, which need more than "not the default");
``attention_config`` layer types are checked; DeepSpeed blocks that DeepSpeed 0.19.8 refuses or
that kerple derives itself cannot be switched on; ``checkpoint_factor`` becomes ``save_interval``.
:func:`compatibility_note` lists the keys a config set that have no effect in kerple, with what
kerple does instead.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kerple.config.deepspeed_keys import REMOVED_BLOCKS, WRITTEN_BY_KERPLE
from kerple.config.neox_keys import FIELDS, KEY_INDEX, field_default
from kerple.config.messages import described, fail, positional_family

if TYPE_CHECKING:
    from kerple.config.config import Config

ATTENTION_TYPES = ("global", "flash")
"""``attention_config`` layer types kerple runs: global attention, and flash (a kernel for it)."""

_BIASED_KINDS = ("bias", "weight")


def check(cfg: Config) -> None:
    """Refuse the GPT-NeoX features kerple lacks; map ``checkpoint_factor`` to ``save_interval``."""
    _refused_features(cfg)
    _model_shape(cfg)
    _layer_scaling(cfg)
    _deepspeed_blocks(cfg)
    _checkpoint_factor(cfg)


def _refused_features(cfg: Config) -> None:
    for ref in FIELDS:
        feature = ref.metadata["refuse"]
        if feature is None:
            continue
        default = field_default(ref)
        if getattr(getattr(cfg, ref.section), ref.name) != default:
            message = f"not implemented in kerple: {feature}; remove the key or set it to {json.dumps(default)}"
            raise fail(cfg, message, ref.ident)


def _model_shape(cfg: Config) -> None:
    """GPT-NeoX shape options that are ordinary at one value and a missing feature at others."""
    neox, model = cfg.neox, cfg.model
    if neox.num_unique_layers not in (None, model.num_layers):
        raise fail(cfg, "layer sharing (fewer unique layers than num_layers) is not implemented in kerple; remove the key",
                   "neox.num_unique_layers")
    if neox.num_kv_heads not in (None, model.num_attention_heads):
        raise fail(
            cfg,
            f"grouped-query attention ({neox.num_kv_heads} key/value heads for {model.num_attention_heads} query heads) "
            "is not implemented in kerple; remove the key or set it to num_attention_heads",
            "neox.num_kv_heads",
        )
    _mlp_width(cfg)
    if neox.gpt_j_tied and model.gpt_j_residual:
        raise fail(cfg, "one LayerNorm shared by attention and MLP (gpt_j_tied) is not implemented in kerple; "
                   "set it to false", "neox.gpt_j_tied")
    prompt = neox.soft_prompt_tuning
    if isinstance(prompt, dict) and prompt.get("enabled"):
        raise fail(cfg, "soft-prompt tuning is not implemented in kerple; remove the key", "neox.soft_prompt_tuning")


def _mlp_width(cfg: Config) -> None:
    """kerple's MLP is 4 x hidden_size wide (docs/reference-format.md §6: ``dense_h_to_4h``)."""
    neox, hidden = cfg.neox, cfg.model.hidden_size
    if neox.intermediate_size is not None and neox.expansion_factor is not None:
        raise fail(
            cfg, "set intermediate_size or expansion_factor, not both", "neox.intermediate_size", "neox.expansion_factor"
        )
    if neox.intermediate_size is not None or neox.expansion_factor is not None:
        ident = "neox.intermediate_size" if neox.intermediate_size is not None else "neox.expansion_factor"
        width = neox.intermediate_size if neox.intermediate_size is not None else int(neox.expansion_factor * hidden)
        if width != 4 * hidden:
            raise fail(
                cfg,
                f"an MLP width of {width} is not implemented in kerple (its MLP is 4 x hidden_size = {4 * hidden}); "
                "remove the key",
                ident,
            )
    multiple = 2 * neox.mlp_multiple_of
    if (4 * hidden) % multiple:
        rounded = -(-4 * hidden // multiple) * multiple
        raise fail(cfg, f"rounds the MLP width 4 x hidden_size = {4 * hidden} up to {rounded}, which kerple does not "
                   "implement; remove the key", "neox.mlp_multiple_of")


def _layer_scaling(cfg: Config) -> None:
    """GPT-NeoX's query-key layer scaling multiplies a positional score term by max(1, layer index)."""
    if not cfg.model.apply_query_key_layer_scaling:
        return
    kind = getattr(positional_family(cfg).kind, "value", positional_family(cfg).kind)
    if kind in _BIASED_KINDS:
        raise fail(
            cfg,
            f"with {described(cfg, 'positional.pos_emb', cfg.positional.pos_emb)}, GPT-NeoX's softmax rescale multiplies "
            "the positional term of layer i by max(1, i); kerple does not implement that: set it to false",
            "model.apply_query_key_layer_scaling",
        )


def attention_layers(cfg: Config) -> None:
    """``attention_config``: ``[[types, count], ...]`` covering num_layers, or ``[[types, "all"]]``."""
    layers = cfg.attention.attention_config
    if layers is None:
        return
    total, num_layers = 0, cfg.model.num_layers
    for item in layers:
        shaped = isinstance(item, list) and len(item) == 2 and isinstance(item[0], list) and bool(item[0])
        count = item[1] if shaped else None
        if not (count == "all" or (isinstance(count, int) and not isinstance(count, bool) and count >= 0)):
            raise fail(cfg, f'expected items [[types...], layer_count or "all"], got {item!r}', "attention.attention_config")
        unsupported = sorted({str(kind) for kind in item[0]} - set(ATTENTION_TYPES))
        if unsupported:
            raise fail(
                cfg,
                f"attention types {unsupported} are not implemented in kerple (it runs {' and '.join(ATTENTION_TYPES)}, "
                "the same global attention); remove the key",
                "attention.attention_config",
            )
        if count == "all":
            if num_layers % len(item[0]):
                message = f"the pattern {item[0]} does not divide num_layers = {num_layers}"
                raise fail(cfg, message, "attention.attention_config")
            return  # GPT-NeoX repeats this pattern over every layer
        total += count
    if total != num_layers:
        raise fail(cfg, f"covers {total} layers but num_layers is {num_layers}", "attention.attention_config")


def _block_ident(cfg: Config, block: str) -> str:
    """A provenance identity for a block: its first sub-key that some file set."""
    prefix = f"{block}."
    return next((ident for ident in cfg.sources if ident.startswith(prefix)), prefix + "enabled")


def _deepspeed_blocks(cfg: Config) -> None:
    ds = cfg.deepspeed
    for block in ("amp", "elasticity", "curriculum_learning", "data_efficiency"):
        if getattr(ds, block).get("enabled"):
            reason = REMOVED_BLOCKS.get(block, "DeepSpeed's data efficiency pipeline, which needs DeepSpeed's data loader")
            raise fail(cfg, f"{reason} is not available in kerple; set enabled: false or remove the block",
                       _block_ident(cfg, block))
    if ds.compression_training:
        raise fail(cfg, f"{REMOVED_BLOCKS['compression_training']} is not available in kerple; remove the block",
                   _block_ident(cfg, "compression_training"))
    for key in ds.deepspeed_extra_args:
        if key in WRITTEN_BY_KERPLE:
            reason = f"kerple writes '{key}' into the DeepSpeed config from its own keys; set those instead"
        elif key in REMOVED_BLOCKS or key == "sparse_gradients":
            reason = "DeepSpeed 0.19.8 refuses this key"
        elif _set_in_section(cfg, "deepspeed", key):
            reason = f"'{key}' is also set at the top level; keep one"
        else:
            continue
        raise fail(cfg, reason, f"deepspeed_extra_args.{key}")


def _set_in_section(cfg: Config, section: str, key: str) -> bool:
    """Whether ``key`` is a key of ``section`` whose value differs from its default."""
    ref = KEY_INDEX.get(key)
    return ref is not None and ref.section == section and getattr(getattr(cfg, section), ref.name) != field_default(ref)


def _checkpoint_factor(cfg: Config) -> None:
    """GPT-NeoX's ``checkpoint_factor`` with the linear scale is a save interval."""
    factor = cfg.checkpointing.checkpoint_factor
    if factor is None or cfg.neox.checkpoint_scale != "linear":
        return
    if not float(factor).is_integer():
        message = f"must be a whole number with checkpoint_scale linear, got {factor}"
        raise fail(cfg, message, "checkpointing.checkpoint_factor")
    explicit = cfg.provenance("checkpointing.save_interval")[0] != "<default>"
    if explicit and cfg.checkpointing.save_interval != int(factor):
        raise fail(
            cfg,
            f"{described(cfg, 'checkpointing.checkpoint_factor', factor)} and "
            f"{described(cfg, 'checkpointing.save_interval', cfg.checkpointing.save_interval)} both set the save "
            "interval; keep one",
            "checkpointing.checkpoint_factor",
            "checkpointing.save_interval",
        )
    cfg.checkpointing.save_interval = int(factor)


def _set_by(cfg: Config, ref: Any) -> tuple[str, str] | None:
    """``(file, key as written)`` of the source that set a field, or ``None`` when none did."""
    if ref.ident in cfg.sources:
        return cfg.sources[ref.ident]
    if ref.metadata["block"]:
        prefix = f"{ref.primary}."
        found = next((cfg.sources[ident] for ident in cfg.sources if ident.startswith(prefix)), None)
        if found is not None:
            return found[0], ref.primary
    return None


def compatibility_note(cfg: Config) -> str | None:
    """One text block listing the keys some file set that have no effect in kerple, or ``None``.

    Each line reads ``key = value (file): what kerple does instead``.
    """
    lines = []
    for ref in FIELDS:
        if ref.metadata["effect"] or ref.metadata["derived"]:
            continue
        origin = _set_by(cfg, ref)
        if origin is None:
            continue
        value = getattr(getattr(cfg, ref.section), ref.name)
        lines.append(f"  {ref.primary} = {json.dumps(value, default=str)} ({origin[0]}): {ref.metadata['help']}")
    if not lines:
        return None
    return f"GPT-NeoX keys accepted without effect in kerple ({len(lines)}):\n" + "\n".join(lines)


def unused_data_path_note(cfg: Config) -> str | None:
    """A warning when ``data_path`` is set beside ``train_data_paths``, which win (as in GPT-NeoX): a
    ``data_path`` added over a data config that names separate files would otherwise be ignored
    without a word."""
    data = cfg.data
    if not data.data_path or not data.train_data_paths:
        return None
    return (f"warning: data_path {data.data_path} ({cfg.provenance('data.data_path')[0]}) is not used: "
            f"train_data_paths {data.train_data_paths} ({cfg.provenance('data.train_data_paths')[0]}) take precedence, "
            "as in GPT-NeoX; to train on data_path, also set train_data_paths=null valid_data_paths=null "
            "test_data_paths=null")
