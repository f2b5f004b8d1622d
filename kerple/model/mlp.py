"""GPT-NeoX feed-forward block and normalization (docs/reference-format.md §4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # exact (erf) GELU, GPT-NeoX's default without bias_gelu_fusion
    "relu": F.relu,
    "softsign": F.softsign,
    "swish": F.silu,  # x * sigmoid(x)
    "mish": F.mish,
}
"""GPT-NeoX activations with an unchanged MLP shape; the gated ones (``geglu``, ``swiglu``, ...) widen dense_h_to_4h and are refused when the config loads."""


class MLP(nn.Module):
    """``dense_h_to_4h`` [4h, h] -> activation -> ``dense_4h_to_h`` [h, 4h], biases on both."""

    def __init__(self, hidden_size: int, activation: str = "gelu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unsupported activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[activation]
        self.dense_h_to_4h = nn.Linear(hidden_size, 4 * hidden_size)
        self.dense_4h_to_h = nn.Linear(4 * hidden_size, hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[b, s, h]`` -> ``[b, s, h]``."""
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(hidden)))  # via [b, s, 4h]


class RMSNorm(nn.Module):
    """GPT-NeoX RMSNorm: ``x / (||x||_2 / sqrt(h) + eps) * scale`` (parameter ``scale``)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(hidden_size))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.scale)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rms = hidden.norm(2, dim=-1, keepdim=True) * hidden.shape[-1] ** -0.5
        return hidden / (rms + self.eps) * self.scale


class ScaleNorm(nn.Module):
    """GPT-NeoX ScaleNorm (Nguyen & Salazar 2019): ``x / max(||x||_2, eps) * g`` (one scalar ``g``)."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.ones(1))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.g)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden / hidden.norm(2, dim=-1, keepdim=True).clamp(min=self.eps) * self.g


NORMS: tuple[str, ...] = ("layernorm", "rmsnorm", "scalenorm")


def build_norm(norm: str, hidden_size: int, eps: float) -> nn.Module:
    """The normalization ``norm`` with epsilon ``eps``; every norm exposes ``reset_parameters()``.

    ``layernorm`` is ``nn.LayerNorm`` (keys ``weight``/``bias``, ones/zeros), the paper's setting.
    """
    if norm == "layernorm":
        return nn.LayerNorm(hidden_size, eps=eps)
    if norm == "rmsnorm":
        return RMSNorm(hidden_size, eps)
    if norm == "scalenorm":
        return ScaleNorm(eps)
    raise ValueError(f"unsupported norm {norm!r}; choose one of {', '.join(NORMS)}")
