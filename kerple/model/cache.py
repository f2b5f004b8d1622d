"""Key/value cache for incremental decoding, optionally windowed (thesis §4.9.2).

Each layer keeps its (already rotated) keys and values ``[b, H, t, head_dim]``. With
``window=W`` only the last ``W`` keys/values are kept after every step, and attention is restricted
to the last ``W`` keys (the attention window of thesis §4.3.3), so decoding costs O(W) per token
instead of O(L) while positions keep counting from the start of the sequence. With
``W >= length`` this is exactly full attention; in general it is exactly a full forward with
``attention_window = W``.

Keys are contiguous positions ending at the newest token, so the positional terms of a step are
read from distance tables of length ``cached + new`` (one row per new query, never an ``L×L``
rebuild). A term computed from each layer's input (CABLE) keeps its per-token values ``[b, H, t]``
here too, beside the keys and trimmed to the same window.
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer keys/values plus the absolute position of the next token.

    Use: ``cache = model.new_cache(window=None)``, then ``model(tokens_chunk, cache=cache)``
    repeatedly; each call appends the chunk and advances ``cache.position``.
    """

    def __init__(self, num_layers: int, window: int | None = None) -> None:
        if window is not None and window < 1:
            raise ValueError(f"cache window must be >= 1, got {window}")
        self.window = window
        self.position = 0  # absolute position of the next token
        self._keys: list[torch.Tensor | None] = [None] * num_layers
        self._values: list[torch.Tensor | None] = [None] * num_layers
        self._term_values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def cached_length(self) -> int:
        """Number of positions currently held (the same for every layer between steps)."""
        keys = self._keys[0]
        return 0 if keys is None else keys.shape[-2]

    def extend(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's ``key``/``value`` ``[b, H, n, d]``; return all keys/values to attend to.

        The returned tensors are ``[b, H, cached + n, d]``; what is stored for the next step is
        trimmed to the last ``window`` positions.
        """
        past_key, past_value = self._keys[layer], self._values[layer]
        if past_key is not None:
            key = torch.cat([past_key, key], dim=-2)  # [b, H, t + n, d]
            value = torch.cat([past_value, value], dim=-2)
        if self.window is not None and key.shape[-2] > self.window:
            self._keys[layer] = key[..., -self.window :, :].contiguous()
            self._values[layer] = value[..., -self.window :, :].contiguous()
        else:
            self._keys[layer], self._values[layer] = key, value
        return key, value

    def term_values(self, layer: int) -> torch.Tensor | None:
        """The per-token values ``[b, H, t]`` a layer's positional term stored for the cached tokens, or ``None``."""
        return self._term_values[layer]

    def extend_term_values(self, layer: int, values: torch.Tensor) -> torch.Tensor:
        """Append this step's per-token term values ``[b, H, n]``; return ``[b, H, cached + n]``, kept for
        the next step trimmed to the last ``window`` positions like the keys."""
        past = self._term_values[layer]
        if past is not None:
            values = torch.cat([past, values], dim=-1)  # [b, H, t + n]
        if self.window is not None and values.shape[-1] > self.window:
            self._term_values[layer] = values[..., -self.window :].contiguous()
        else:
            self._term_values[layer] = values
        return values

    def advance(self, num_tokens: int) -> None:
        """Move the position counter past a step of ``num_tokens`` tokens (called by the model)."""
        self.position += num_tokens
