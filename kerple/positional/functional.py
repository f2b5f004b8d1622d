"""Small numerical helpers shared by the positional families.

Kept free of module state so they can be tested and reused (e.g. by a FlexAttention ``score_mod``).
"""

from __future__ import annotations

import torch


def distance_vector(k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Causal distances ``0, 1, ..., k_len - 1`` as float32 ``[k_len]``.

    Distances are exact in fp32 up to 2**24, far beyond any sequence length used here (the
    reference builds them in bf16, where integers above 256 are rounded; docs/reference-format.md §2).
    """
    return torch.arange(k_len, device=device, dtype=torch.float32)


def straight_through_clamp(value: torch.Tensor, min: float, max: float | None = None) -> torch.Tensor:
    """Clamp in the forward pass, identity in the backward pass.

    The reference clamps its KERPLE parameters in place before each forward but, under its bf16
    optimizer, the fp32 master copy is never clamped: the forward sees the clamped value while
    the gradient is applied unchanged to the unclamped master (docs/reference-format.md §2). This reproduces
    that rule without touching the stored parameter. It is written
    ``clamp(value).detach() + (value - value.detach())`` rather than the equivalent
    ``value + (clamp(value) - value).detach()`` because the former is bit-exact in the forward
    (``x - x`` is exactly 0, whereas ``-1 + 1.01`` is not exactly ``0.01`` in float32).
    """
    clamped = value.detach().clamp(min=min, max=max)
    return clamped + (value - value.detach())


def distance_power(distance: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``distance ** exponent`` with ``0 ** p = 0`` and zero gradient in ``p`` at distance 0.

    Mathematically ``d/dp d^p = d^p * log(d)`` is ``0 * -inf`` at ``d = 0``. Eager PyTorch masks
    that case in ``pow``'s backward, but this function does not rely on it (other backends and
    compiled ``score_mod`` kernels need not): the power is taken of ``max(d, 1)``, whose log is 0
    at the masked entries so every intermediate is finite, and the ``d = 0`` entries are then
    replaced by 0. Broadcasts like ``torch.pow``; ``0 ** p = 0`` needs ``p > 0``, which the clamps
    of the KERPLE family guarantee.
    """
    safe_power = distance.clamp(min=1.0) ** exponent
    return torch.where(distance > 0, safe_power, torch.zeros_like(safe_power))
