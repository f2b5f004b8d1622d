"""Inference: KV-cached generation and windowed-cache perplexity.

Public API: :func:`generate`, :func:`sample_next`, :class:`GenerationError`
(``kerple.inference.generate``) and :func:`windowed_cache_losses` (``kerple.inference.windowed``).
"""

from kerple.inference.generate import GenerationError, generate, sample_next
from kerple.inference.windowed import windowed_cache_losses

__all__ = ["GenerationError", "generate", "sample_next", "windowed_cache_losses"]
