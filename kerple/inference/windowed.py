"""Perplexity under a sliding key/value cache (thesis §4.9.2).

Tokens are fed through the model in chunks with a :class:`kerple.model.KVCache` that keeps only the
last ``W`` keys/values. Every query attends to at most its last ``W`` keys (positions still count
from the start of the window), so the cost is O(W·L) instead of O(L²); with ``W >= length`` the
result equals full attention, and in general it equals a full forward with ``attention_window = W``.
The thesis reports that ALiBi and Sandwich keep their perplexity close to full attention with
W = 2048.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def windowed_cache_losses(
    model: nn.Module,
    tokens: torch.Tensor,
    cache_window: int,
    labels: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
    logit_chunk: int = 256,
) -> torch.Tensor:
    """Per-token cross entropy (float32) of ``model`` decoding ``tokens`` with a ``cache_window`` cache.

    ``tokens [b, n]`` with ``labels [b, n]`` (the next tokens) returns ``[b, n]``; without
    ``labels`` the targets are ``tokens[:, 1:]`` and the result is ``[b, n - 1]``.
    ``chunk_size`` tokens are processed per forward (default ``cache_window``); the LM head runs on
    ``logit_chunk`` positions at a time so full ``[b, n, V]`` logits never exist.
    ``model`` must provide ``new_cache(window)``, ``hidden_states(tokens, cache)`` and
    ``lm_head_weight`` (:class:`kerple.model.GPTModel`).
    """
    if cache_window < 1:
        raise ValueError(f"cache_window must be >= 1, got {cache_window}")
    if labels is None:
        tokens, labels = tokens[:, :-1], tokens[:, 1:]
    if labels.shape != tokens.shape:
        raise ValueError(f"labels {tuple(labels.shape)} must have the shape of tokens {tuple(tokens.shape)}")
    step = chunk_size or cache_window
    cache = model.new_cache(window=cache_window)
    weight = model.lm_head_weight
    losses = []
    for start in range(0, tokens.shape[1], step):
        hidden = model.hidden_states(tokens[:, start : start + step], cache=cache)  # [b, c, h]
        target = labels[:, start : start + step]
        for offset in range(0, hidden.shape[1], logit_chunk):
            logits = F.linear(hidden[:, offset : offset + logit_chunk], weight).float()  # [b, c', V]
            piece = target[:, offset : offset + logit_chunk]
            losses.append(F.cross_entropy(logits.transpose(1, 2), piece, reduction="none"))
    return torch.cat(losses, dim=1)
