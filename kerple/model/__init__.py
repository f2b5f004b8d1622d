"""GPT-NeoX model with eager | sdpa | flex attention and a shared, pluggable positional embedding.

Public API: :func:`build_model`, :class:`GPTModel`, :class:`KVCache`,
:func:`kerple.model.attention.unsupported_reason`, :func:`kerple.model.attention.choose_implementation`
(``attention_impl: auto``), :func:`maybe_compile` (``compile: true``).
"""

from kerple.model.attention import ATTENTION_IMPLS, AUTO, choose_implementation, unsupported_reason
from kerple.model.cache import KVCache
from kerple.model.gpt import GPTModel, build_model, maybe_compile

__all__ = [
    "ATTENTION_IMPLS",
    "AUTO",
    "GPTModel",
    "KVCache",
    "build_model",
    "choose_implementation",
    "maybe_compile",
    "unsupported_reason",
]
