"""GPT-NeoX model with eager | sdpa | flex attention and a shared, pluggable positional embedding.

Public API: :func:`build_model`, :class:`GPTModel`, :class:`KVCache`,
:func:`kerple.model.attention.unsupported_reason`.
"""

from kerple.model.attention import ATTENTION_IMPLS, unsupported_reason
from kerple.model.cache import KVCache
from kerple.model.gpt import GPTModel, build_model

__all__ = ["ATTENTION_IMPLS", "GPTModel", "KVCache", "build_model", "unsupported_reason"]
