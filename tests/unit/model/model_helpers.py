"""Tiny models and an independent GPT-NeoX forward for the model tests."""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from kerple import positional
from kerple.model import GPTModel

LAYERS, HIDDEN, HEADS, VOCAB = 2, 32, 4, 64
HEAD_DIM = HIDDEN // HEADS
# FIRE: 8 hidden units test the same code as 32 with a quicker unfused flex; a threshold of 4 (not 128 / 8)
# makes the normalised input span [0, 1] within the tests' few tokens, so every parameter gets a gradient
TINY_OPTIONS = {"fire": {"fire_mlp_width": 8, "fire_init_threshold": 4.0}}



def tiny_model(name: str, *, seed: int = 0, impl: str = "eager", window: int | None = None, **kwargs) -> GPTModel:
    """A 2-layer, h=32, 4-head model with the registry's embedding ``name`` (flex not compiled)."""
    torch.manual_seed(seed)
    options = {**TINY_OPTIONS.get(name, {}), **kwargs.pop("options", {})}
    pe = positional.build(name, num_heads=HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN, max_positions=128,
                         num_layers=LAYERS, **options)
    kwargs.setdefault("flex_compile", False)
    return GPTModel(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        padded_vocab_size=VOCAB,
        positional=pe,
        attention_impl=impl,
        attention_window=window,
        **kwargs,
    )


def supported_impls(name: str) -> list[str]:
    """Attention implementations that can run a forward for ``name`` (on CPU, evaluation)."""
    from kerple.model.attention import unsupported_reason

    cls = positional.family(name)
    return [
        impl
        for impl in ("eager", "sdpa", "flex")
        if unsupported_reason(impl, cls.kind, "cpu", training=False) is None
    ]


def reference_forward(
    state: dict[str, torch.Tensor],
    tokens: torch.Tensor,
    *,
    num_layers: int,
    num_heads: int,
    bias: torch.Tensor | None = None,
    window: int | None = None,
    layer_bias: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """GPT-NeoX forward written from docs/reference-format.md §3-4 alone, reading weights by reference key.

    ``bias`` is a dense ``[H, s, s]`` additive term on the scaled scores (``None``: no term);
    ``layer_bias(layer, x)`` instead gives layer ``layer``'s ``[b, H, s, s]`` term from its normalised
    input ``x [b, s, h]`` (CABLE). Loops over heads and uses explicit per-head slicing of the fused QKV rows.
    """
    batch, seq = tokens.shape
    hidden = state["sequential.0.word_embeddings.weight"][tokens]
    if "sequential.0.position_embeddings.weight" in state:
        hidden = hidden + state["sequential.0.position_embeddings.weight"][:seq]
    width = hidden.shape[-1]
    head_dim = width // num_heads

    def layer_norm(x: torch.Tensor, prefix: str) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * state[prefix + ".weight"] + state[prefix + ".bias"]

    def linear(x: torch.Tensor, prefix: str) -> torch.Tensor:
        return x @ state[prefix + ".weight"].T + state[prefix + ".bias"]

    position = torch.arange(seq)
    distance = position[:, None] - position[None, :]
    visible = distance >= 0
    if window is not None:
        visible &= distance < window
    for index in range(num_layers):
        p = f"sequential.{index + 2}"
        x = layer_norm(hidden, f"{p}.input_layernorm")
        term = bias if layer_bias is None else layer_bias(index, x)  # [H, s, s] or [b, H, s, s]
        qkv = linear(x, f"{p}.attention.query_key_value")  # [b, s, 3h]
        heads = []
        for h in range(num_heads):
            block = qkv[..., h * 3 * head_dim : (h + 1) * 3 * head_dim]
            q, k, v = block[..., :head_dim], block[..., head_dim : 2 * head_dim], block[..., 2 * head_dim :]
            scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
            if term is not None:
                scores = scores + term[..., h, :, :]
            scores = scores.masked_fill(~visible, -1e30)
            heads.append(torch.softmax(scores, -1) @ v)
        attention = linear(torch.cat(heads, -1), f"{p}.attention.dense")
        hidden = hidden + attention
        x = layer_norm(hidden, f"{p}.post_attention_layernorm")
        hidden = hidden + linear(F.gelu(linear(x, f"{p}.mlp.dense_h_to_4h")), f"{p}.mlp.dense_4h_to_h")
    hidden = layer_norm(hidden, f"sequential.{num_layers + 3}.norm")
    return hidden @ state[f"sequential.{num_layers + 4}.final_linear.weight"].T


def fire_reference_bias(state: dict[str, torch.Tensor], seq: int) -> torch.Tensor:
    """FIRE: ``MLP(ψ(i - j) / ψ(max(i, L)))``, ψ(x) = log(|c x| + 1), ``[H, s, s]``."""
    prefix = "sequential.2.attention.fire."
    c = state[prefix + "c"].abs()
    threshold = (state[prefix + "L_multiplier"] * state[prefix + "init_L"]).abs()
    position = torch.arange(seq, dtype=torch.float32)
    distance = (position[:, None] - position[None, :]).clamp(min=0)
    x = torch.log(c * distance + 1) / (torch.log(c * torch.maximum(position, threshold) + 1) + 1e-6)[:, None]
    hidden = torch.relu(x[..., None] @ state[prefix + "mlp.0.weight"].T + state[prefix + "mlp.0.bias"])
    return (hidden @ state[prefix + "mlp.2.weight"].T).permute(2, 0, 1)


def cable_reference_bias(state: dict[str, torch.Tensor]) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """CABLE for layer ``l``: ``s_i - s_j``, ``s_t = Σ_{k<=t} -softplus(W_l x_k + a_l)``, ``[b, H, s, s]``."""

    def layer_bias(layer: int, x: torch.Tensor) -> torch.Tensor:
        weight = state["sequential.2.attention.cable.weight"][layer]
        bias = state["sequential.2.attention.cable.bias"][layer]
        sums = torch.cumsum(-F.softplus(x @ weight.T + bias), dim=1).transpose(1, 2)  # [b, H, s]
        return sums[..., :, None] - sums[..., None, :]

    return layer_bias
