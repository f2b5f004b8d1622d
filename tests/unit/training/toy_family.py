"""A toy model family, to show what adding one costs: this file and one registry line.

``causalmean``: GPT-NeoX layers whose attention is replaced by a causal running mean of the
values (every query weighs all earlier tokens equally), with no positional embedding. It declares
what it supports in ``FAMILY``; nothing else in the project names it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kerple.model.decoder import Decoder, model_arguments
from kerple.model.family import ModelFamily
from kerple.model.transformer import TransformerLayer, transformer_layers


class CausalMean(nn.Module):
    """``dense(mean of v over positions <= m)``, with GPT-NeoX's projection names."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: torch.Tensor, context: Any) -> torch.Tensor:
        value = self.query_key_value(hidden).chunk(3, dim=-1)[2]  # [b, s, h]
        counts = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)[:, None]
        return self.dense(value.cumsum(dim=1) / counts)


class CausalMeanModel(Decoder):
    def __init__(self, *, num_layers: int, activation: str, gpt_j_residual: bool, init_method: str,
                 output_layer_init_method: str, init_method_std: float, **shared: Any) -> None:
        layer = {key: shared[key] for key in ("hidden_size", "norm", "layernorm_epsilon", "hidden_dropout")}

        def build_layers() -> list[TransformerLayer]:
            return transformer_layers(num_layers, num_heads=shared["num_attention_heads"], activation=activation,
                                      gpt_j_residual=gpt_j_residual, attention=lambda i: CausalMean(shared["hidden_size"]),
                                      **layer)

        super().__init__(build_layers=build_layers, positional=None, **shared)
        self.init_weights(init_method, output_layer_init_method, init_method_std)

    def hidden_states(self, tokens: torch.Tensor, cache: Any = None) -> torch.Tensor:
        hidden = self.embedding(tokens)
        for layer in self.layers:
            hidden = layer(hidden, None)
        return self.final_norm(hidden)

    def set_attention(self, impl: str | None = None, window: int | None | str = "keep") -> None:
        if impl not in (None, "eager") or window not in ("keep", None):
            raise ValueError("causalmean has one kernel and no window")

    def resolve_attention_impl(self, device_type: str, training: bool, seq_len: int) -> str:
        return "eager"

    def gradient_attention_impl(self, device_type: str, seq_len: int) -> str:
        return "eager"

    def set_temperature(self, temperature: float) -> None:
        if temperature != 1.0:
            raise ValueError("causalmean has no softmax")

    def positional_parameters(self) -> list[nn.Parameter]:
        return []


def build(cfg: Any, *, flex_compile: bool = True) -> CausalMeanModel:
    return CausalMeanModel(num_layers=cfg.model.num_layers, **model_arguments(cfg.model))


FAMILY = ModelFamily(
    name="causalmean", summary="a toy: causal running means instead of attention", build=build,
    layer_count_key="num_layers", positional_embedding=False, attention_impls=("eager",), attention_window=False,
    kv_cache=False, softmax_temperature=False, tensor_parallel=False, pipeline_parallel=False,
    recorded_args=("arch",), neox_export=False, hf_export=None,
)
