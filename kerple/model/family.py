"""What a model family declares: how to build it from a config and what it supports.

A family is one ``model.arch`` value. It lives in one file that defines its decoder (a
:class:`~kerple.model.decoder.Decoder`) and a module-level ``FAMILY = ModelFamily(...)``, and takes
one line in :mod:`kerple.model.families`. Configuration checks, checkpoint records, the converters,
evaluation, generation and analysis ask these fields; none of them compares family names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn


@dataclass(frozen=True)
class ModelFamily:
    """One ``model.arch``: its builder and its capabilities.

    Attributes:
        name: the ``model.arch`` value.
        summary: one line for ``docs/config.md`` and error messages.
        build: ``build(cfg, flex_compile=...) -> Decoder``.
        layer_count_key: the ``model`` key whose value is the number of layer modules the weights
            hold (``num_layers``; RegularGPT's shared blocks are ``regular_thickness``).
        positional_embedding: reads ``pos_emb`` (otherwise the config must say ``none``).
        attention_impls: the ``attention_impl`` values it runs (``auto`` included where it has one).
        attention_window: takes ``attention_window`` (thesis §4.3.3).
        kv_cache: decodes incrementally with a KV cache (and ``--cache-window``).
        softmax_temperature: takes a softmax temperature other than 1 (thesis §5.4).
        tensor_parallel, pipeline_parallel: splits over ranks that way.
        recorded_args: ``model`` keys written into a checkpoint's ``args`` (beyond the record every
            family writes) and compared when it is loaded.
        legacy_args: the value a recorded key had in checkpoints written before it was recorded.
        neox_export: a GPT-NeoX checkpoint can hold it (``convert --to neox``).
        hf_export: how it exports to Hugging Face, or ``None`` when it cannot.
    """

    name: str
    summary: str
    build: Callable[..., nn.Module]
    layer_count_key: str
    positional_embedding: bool
    attention_impls: tuple[str, ...]
    attention_window: bool
    kv_cache: bool
    softmax_temperature: bool
    tensor_parallel: bool
    pipeline_parallel: bool
    recorded_args: tuple[str, ...] = ()
    legacy_args: dict[str, Any] = field(default_factory=dict)
    neox_export: bool = True
    hf_export: str | None = None
