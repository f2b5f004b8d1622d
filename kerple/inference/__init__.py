"""Inference: KV-cached generation and windowed-cache perplexity.

Public API: :func:`generate`, :func:`sample_next` (``kerple.inference.generate``) and
:func:`windowed_cache_losses` (``kerple.inference.windowed``).
"""

from kerple.inference.generate import generate, sample_next
from kerple.inference.windowed import windowed_cache_losses

__all__ = ["generate", "sample_next", "windowed_cache_losses"]
