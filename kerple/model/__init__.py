"""The decoders of every model family, with eager | sdpa | flex | triton attention and pluggable positions.

Public API: :func:`build_model` (the family of ``model.arch``, from :mod:`kerple.model.families`),
:class:`Decoder` (what every family shares), :class:`GPTModel`, :class:`KVCache`,
:func:`kerple.model.attention.unsupported_reason`, :func:`kerple.model.attention.choose_implementation`
(``attention_impl: auto``), :func:`maybe_compile` (``compile: true``).
"""

from kerple.model.attention import ATTENTION_IMPLS, AUTO, choose_implementation, unsupported_reason
from kerple.model.cache import KVCache
from kerple.model.decoder import Decoder, maybe_compile
from kerple.model.families import build_model, family, family_of
from kerple.model.gpt import GPTModel

__all__ = [
    "ATTENTION_IMPLS",
    "AUTO",
    "Decoder",
    "GPTModel",
    "KVCache",
    "build_model",
    "choose_implementation",
    "family",
    "family_of",
    "maybe_compile",
    "unsupported_reason",
]
