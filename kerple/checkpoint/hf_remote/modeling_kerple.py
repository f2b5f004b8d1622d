"""``KerpleForCausalLM``: kerple's GPT-NeoX decoder for ``transformers``, with no kerple installed.

kerple's exporter (``tools/convert_checkpoint.py SRC OUT --to hf``) copies this file and
``configuration_kerple.py`` unchanged into every folder whose model no stock ``transformers``
class computes, and names them in ``config.json``'s ``auto_map``, so that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads it (docs/interop.md).
It needs only ``torch`` and ``transformers``. kerple's tests compare its logits with kerple's own
model for every positional embedding of kerple's registry (fp32, within 1e-5), and its greedy
generation with kerple's, token for token; that comparison is what keeps this file and kerple's
math the same.

The positional embedding is data, not code: ``config.positional`` names, for each place where an
embedding can act, a *form* (a formula of this file) and its per-head parameters:

* ``input``: added to the token embeddings (``learned`` table, ``sinusoidal``);
* ``query_key``: applied to queries and keys (``rotary``, ``xpos``);
* ``bias``: added to the scaled attention logits;
* ``weight``: multiplies the scaled logits first, ``scores * weight + bias`` (KERPLE paper §5.3);
* ``layer_bias``: added to the scaled logits too, computed by each layer from its input (``cable``).

Most ``bias`` and ``weight`` forms are functions of the causal distance ``d = i - j`` alone: each
builds a per-head table ``[H, k_len]`` once per forward, which is gathered into ``[H, q_len, k_len]``
and shared by all layers; a ``bias`` form of the query position as well (``fire``) receives the
queries' position ids and returns ``[b, H, q_len, k_len]``. A parameter is a number, a list (one
value per head) or ``{"tensor": name, "min": lo, "max": hi}``: a tensor stored under
``gpt_neox.positional.<name>`` (listed in ``config.positional["tensors"]``), clamped to ``[lo, hi]``
in the forward. A new embedding adds one form to the table of its place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_kerple import KerpleConfig

Value = Any  # a resolved parameter: a float, or a float tensor


# --- bias / weight forms: (distances [1, k], parameters) -> per-head table [H, k] -------------------
def _per_head(value: Value) -> Value:
    """A per-head parameter as a column ``[H, 1]`` (numbers stay numbers)."""
    return value.reshape(value.shape[0], 1) if isinstance(value, torch.Tensor) else value


def distance_power(distance: torch.Tensor, exponent: Value) -> torch.Tensor:
    """``d ** p`` with ``0 ** p = 0`` (KERPLE paper Eq. (2)); exponent 1 is ``d``, 2 is ``d * d``."""
    if not isinstance(exponent, torch.Tensor) and exponent in (1, 2):
        return distance if exponent == 1 else distance.square()
    powered = distance.clamp(min=1.0) ** exponent
    return torch.where(distance > 0, powered, torch.zeros_like(powered))


def power_form(distance: torch.Tensor, a: Value, p: Value = 1) -> torch.Tensor:
    """``-a * d^p``: ALiBi (``p = 1``), KERPLE power (paper §4)."""
    return -(distance_power(distance, _per_head(p)) * _per_head(a))


def log_form(distance: torch.Tensor, a: Value, b: Value, p: Value = 1, offset: Value = 0.0) -> torch.Tensor:
    """``-a * log(1 + b * d^p) + offset``: KERPLE log (paper §4) and 3-para-log (§5.3), smoothed
    Sandwich (thesis §4.6.2)."""
    table = -(_per_head(a) * torch.log1p(_per_head(b) * distance_power(distance, _per_head(p))))
    return table + _per_head(offset)


def exp_form(distance: torch.Tensor, a: Value, p: Value = 1, s: Value = 1.0) -> torch.Tensor:
    """``s * exp(-a * d^p)``: Gaussian-like kernels (KERPLE Appendix A.3), KERPLE weights (§5.3)."""
    return _per_head(s) * torch.exp(-(_per_head(a) * distance_power(distance, _per_head(p))))


def t5_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Causal T5 bucket of each distance (Raffel et al. 2020): exact below ``num_buckets / 2``,
    log-spaced up to ``max_distance``; the log branch in float32, truncated."""
    exact = num_buckets // 2
    scaled = distance.clamp(min=exact).float() / exact
    log_bucket = exact + (torch.log(scaled) / math.log(max_distance / exact) * (num_buckets - exact)).long()
    return torch.where(distance < exact, distance, log_bucket.clamp(max=num_buckets - 1))


def bucket_form(distance: torch.Tensor, table: torch.Tensor, num_buckets: int, max_distance: int, scale: float) -> torch.Tensor:
    """T5 bias: ``table[bucket(d), h] * scale`` with ``table`` ``[num_buckets, H]``."""
    buckets = t5_bucket(distance.reshape(-1).long(), num_buckets, max_distance)  # [k]
    return table[buckets].transpose(0, 1) * scale  # [H, k]


def sandwich_form(distance: torch.Tensor, dim: int, ratio: Value) -> torch.Tensor:
    """Sandwich (thesis Eq. (4.6)): ``(sum_i cos(d / 10000^(2i/dim)) - dim/2) / ratio_h``, i = 0..dim/2-1."""
    exponents = torch.arange(dim // 2, dtype=distance.dtype, device=distance.device) * 2 / dim
    angles = distance[..., None] * (1.0 / (10000.0**exponents))  # [1, k, dim/2]
    return (angles.cos().sum(dim=-1) - dim / 2) / _per_head(ratio)


DISTANCE_FORMS: dict[str, Callable[..., torch.Tensor]] = {
    "power": power_form,
    "log": log_form,
    "exp": exp_form,
    "bucket": bucket_form,
    "sandwich": sandwich_form,
}


# --- bias forms of the query position too: (distances [q, k], query positions [b, q], parameters) ---
def fire_form(
    distance: torch.Tensor, query_position: torch.Tensor, c: torch.Tensor, L_multiplier: torch.Tensor,
    init_L: torch.Tensor, first_weight: torch.Tensor, first_bias: torch.Tensor, second_weight: torch.Tensor,
) -> torch.Tensor:
    """FIRE (Li et al. 2023, arXiv 2310.04418): ``MLP(ψ(i - j) / ψ(max(i, L)))``, ``ψ(x) = log(|c·x| + 1)``,
    ``L = |L_multiplier·init_L|``, the MLP ``Linear(1, W)``, ReLU, ``Linear(W, H)`` without bias,
    ``i`` the query's position; ``[b, H, q, k]``."""
    c = c.abs()
    threshold = (L_multiplier * init_L).abs()
    normaliser = torch.log1p(c * torch.maximum(query_position.float(), threshold)) + 1e-6  # [b, q]
    normalised = torch.log1p(c * distance.clamp(min=0)) / normaliser[..., None]  # [b, q, k]
    hidden = torch.relu(normalised[..., None] * first_weight[:, 0] + first_bias)  # [b, q, k, W]
    return (hidden @ second_weight.transpose(0, 1)).permute(0, 3, 1, 2)  # [b, H, q, k]


POSITION_FORMS: dict[str, Callable[..., torch.Tensor]] = {"fire": fire_form}


# --- layer_bias forms: (a layer's input [b, s, h], its index, parameters) -> increments [b, H, s] ---
def cable_increments(
    hidden: torch.Tensor, layer: int, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """CABLE (Veisi et al. 2025, arXiv 2503.08067): ``-softplus(W_l x_t + a_l)`` per head; the bias is ``s_i - s_j``
    with ``s_t`` the running sum of these up to ``t``."""
    return -F.softplus(hidden.float() @ weight[layer].transpose(0, 1) + bias[layer]).transpose(1, 2)


LAYER_FORMS: dict[str, Callable[..., torch.Tensor]] = {"cable": cable_increments}


# --- input forms: (positions [b, s], hidden size, parameters) -> [b, s, h] -------------------------
def learned_input(positions: torch.Tensor, hidden_size: int, table: torch.Tensor) -> torch.Tensor:
    """A trained absolute table; it does not extend past its rows."""
    if positions.numel() and int(positions.max()) >= table.shape[0]:
        raise ValueError(
            f"the learned position table has {table.shape[0]} rows (max_position_embeddings) but position "
            f"{int(positions.max())} was asked for; a learned table cannot extrapolate"
        )
    return table[positions]


def sinusoidal_input(positions: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """``cat(sin(t * inv_freq), cos(t * inv_freq))``, ``inv_freq = 1 / 10000^(2i/h)`` (Vaswani et al. §3.5;
    sines first, as GPT-NeoX)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hidden_size, 2, device=positions.device, dtype=torch.float32) / hidden_size))
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [b, s, h/2]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


INPUT_FORMS: dict[str, Callable[..., torch.Tensor]] = {"learned": learned_input, "sinusoidal": sinusoidal_input}


# --- query/key forms: (query, key [b, H, s, d], positions [b, s], parameters) -> (query, key) -----
def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def _rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The first ``2 * len(inv_freq)`` channels of ``x [b, H, s, d]`` rotated (GPT-NeoX's rotate_half
    layout) and then multiplied by ``scale [b, 1, s, 2 * len(inv_freq)]`` if given, in float32."""
    ndims = 2 * inv_freq.shape[0]
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [b, s, ndims/2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # [b, 1, s, ndims]
    rotated = x[..., :ndims].float()
    rotated = rotated * angles.cos() + _rotate_half(rotated) * angles.sin()
    if scale is not None:
        rotated = rotated * scale
    return torch.cat([rotated.to(x.dtype), x[..., ndims:]], dim=-1)


def rotary_query_key(
    query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary (Su et al. 2021) on the first ``2 * len(inv_freq)`` channels."""
    return _rotate(query, positions, inv_freq), _rotate(key, positions, inv_freq)


def xpos_query_key(
    query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, decay: torch.Tensor,
    scale_base: float, centre: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """xPos (Sun et al. 2022, arXiv 2212.10554): rotary, then pair ``c`` of a query at position ``n`` scaled by
    ``decay_c^((n - centre)/scale_base)`` and of a key by ``decay_c^(-(n - centre)/scale_base)``."""
    offsets = (positions.to(torch.float32) - centre)[..., None] / scale_base  # [b, s, 1]

    def scale(sign: float) -> torch.Tensor:
        half = decay ** (sign * offsets)  # [b, s, ndims/2]
        return torch.cat([half, half], dim=-1)[:, None]  # [b, 1, s, ndims]

    return _rotate(query, positions, inv_freq, scale(1.0)), _rotate(key, positions, inv_freq, scale(-1.0))


QUERY_KEY_FORMS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "rotary": rotary_query_key,
    "xpos": xpos_query_key,
}
FORMS: dict[str, dict[str, Callable[..., Any]]] = {
    "input": INPUT_FORMS,
    "query_key": QUERY_KEY_FORMS,
    "bias": {**DISTANCE_FORMS, **POSITION_FORMS},
    "weight": DISTANCE_FORMS,
    "layer_bias": LAYER_FORMS,
}


class KerplePositional(nn.Module):
    """The embedding's stored tensors and its terms, one per place (see the module docstring)."""

    def __init__(self, config: KerpleConfig) -> None:
        super().__init__()
        spec = dict(config.positional or {})
        for name, info in (spec.get("tensors") or {}).items():
            self._register(name, torch.zeros(info["shape"]), bool(info.get("trainable", False)))
        self.terms = {place: dict(spec[place]) for place in FORMS if spec.get(place)}
        for place, term in self.terms.items():
            if term.get("form") not in FORMS[place]:
                raise ValueError(
                    f"config.positional[{place!r}]: unknown form {term.get('form')!r}; this modeling_kerple.py "
                    f"knows {sorted(FORMS[place])}: export the model again with the kerple version that trained it"
                )
        self.num_heads = config.num_attention_heads
        self.hidden_size = config.hidden_size

    def _register(self, name: str, tensor: torch.Tensor, trainable: bool) -> None:
        """Register ``tensor`` at the dotted ``name`` (``position_embeddings.weight``), creating containers."""
        owner: nn.Module = self
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        if trainable:
            owner.register_parameter(leaf, nn.Parameter(tensor))
        else:
            owner.register_buffer(leaf, tensor)

    def _value(self, spec: Any, dtype: torch.dtype, device: torch.device) -> Value:
        if isinstance(spec, dict):
            owner, _, leaf = spec["tensor"].rpartition(".")
            tensor = getattr(self.get_submodule(owner) if owner else self, leaf).to(device=device, dtype=dtype)
            bounds = {bound: spec[bound] for bound in ("min", "max") if spec.get(bound) is not None}
            return tensor.clamp(**bounds) if bounds else tensor
        if isinstance(spec, list):
            return torch.tensor(spec, dtype=dtype, device=device)
        return spec

    def _parameters_of(self, term: dict[str, Any], dtype: torch.dtype, device: torch.device) -> dict[str, Value]:
        skip = ("form", "float64")
        return {name: self._value(value, dtype, device) for name, value in term.items() if name not in skip}

    def embed(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``hidden [b, s, h]`` plus the input term at ``positions [b, s]``, if there is one."""
        term = self.terms.get("input")
        if term is None:
            return hidden
        added = INPUT_FORMS[term["form"]](positions, self.hidden_size, **self._parameters_of(term, torch.float32, hidden.device))
        return hidden + added.to(hidden.dtype)

    def rotate(self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``query``/``key`` ``[b, H, s, d]`` with the query/key term applied, if there is one."""
        term = self.terms.get("query_key")
        if term is None:
            return query, key
        return QUERY_KEY_FORMS[term["form"]](query, key, positions, **self._parameters_of(term, torch.float32, query.device))

    def logit_term(
        self, place: str, query_index: torch.Tensor, k_len: int, positions: torch.Tensor
    ) -> torch.Tensor | None:
        """The ``bias`` or ``weight`` term, float32 ``[H, q_len, k_len]`` (``[b, H, q_len, k_len]`` for a
        form of the query position, which reads the queries' position ids ``positions [b, q]``), for
        queries at absolute indices ``query_index`` over keys ``0 .. k_len - 1``; ``None`` when the
        embedding has none."""
        term = self.terms.get(place)
        if term is None:
            return None
        if term["form"] in POSITION_FORMS:
            signed = query_index[:, None] - torch.arange(k_len, device=query_index.device)[None, :]  # [q, k]
            parameters = self._parameters_of(term, torch.float32, query_index.device)
            return POSITION_FORMS[term["form"]](signed.to(torch.float32), positions, **parameters)
        dtype = torch.float64 if term.get("float64") else torch.float32
        distance = torch.arange(k_len, dtype=dtype, device=query_index.device)[None, :]  # [1, k]
        table = DISTANCE_FORMS[term["form"]](distance, **self._parameters_of(term, dtype, query_index.device))
        table = table.to(torch.float32).expand(self.num_heads, k_len)  # [H, k]
        offsets = (query_index[:, None] - torch.arange(k_len, device=query_index.device)[None, :]).clamp(min=0)
        return table[:, offsets]  # [H, q, k]

    def layer_increments(self, layer: int, hidden: torch.Tensor) -> torch.Tensor | None:
        """The ``layer_bias`` term's per-token values ``[b, H, s]`` for layer ``layer``'s input
        ``hidden [b, s, h]``, float32; ``None`` when the embedding has no such term."""
        term = self.terms.get("layer_bias")
        if term is None:
            return None
        parameters = self._parameters_of(term, torch.float32, hidden.device)
        return LAYER_FORMS[term["form"]](hidden, layer, **parameters)


# --- the decoder ----------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """GPT-NeoX RMSNorm: ``x / (||x||_2 / sqrt(h) + eps) * scale``."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rms = hidden.norm(2, dim=-1, keepdim=True) * hidden.shape[-1] ** -0.5
        return hidden / (rms + self.eps) * self.scale


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019): ``x / max(||x||_2, eps) * g``."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.ones(1))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden / hidden.norm(2, dim=-1, keepdim=True).clamp(min=self.eps) * self.g


def build_norm(config: KerpleConfig) -> nn.Module:
    norms: dict[str, Callable[[], nn.Module]] = {
        "layernorm": lambda: nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
        "rmsnorm": lambda: RMSNorm(config.hidden_size, config.layer_norm_eps),
        "scalenorm": lambda: ScaleNorm(config.layer_norm_eps),
    }
    if config.norm not in norms:
        raise ValueError(f"config.norm {config.norm!r}: expected one of {sorted(norms)}")
    return norms[config.norm]()


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # exact (erf) GELU
    "relu": F.relu,
    "softsign": F.softsign,
    "swish": F.silu,
    "mish": F.mish,
}


@dataclass
class AttentionInputs:
    """What every layer of one forward shares besides the logit terms (passed to each layer as tensors,
    so that a reentrant activation checkpoint still carries their gradients): positions, the mask, the
    cache, and whether to return the attention probabilities."""

    positions: torch.Tensor  # [b, s] positions of the new tokens
    allowed: torch.Tensor  # bool [b or 1, 1, q, k]
    cache: Cache | None
    output_attentions: bool = False


class KerpleAttention(nn.Module):
    """Fused per-head ``query_key_value`` ``[3h, h]`` (q, k, v of head 0, then head 1, ...) and ``dense``.

    ``attn_implementation="sdpa"`` (transformers' default when it is allowed) runs
    ``scaled_dot_product_attention`` with the bias and the mask as one float mask, in float32 like the
    eager path. A ``weight`` term multiplies the logits, which no additive mask can express, so those
    models, and a call that asks for the attention probabilities, take the eager path.
    """

    def __init__(self, config: KerpleConfig, layer_index: int) -> None:
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.layer_index = layer_index
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self,
        hidden: torch.Tensor,
        bias: torch.Tensor | None,
        scale: torch.Tensor | None,
        inputs: AttentionInputs,
        positional: KerplePositional,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention output ``[b, s, h]`` and, with ``inputs.output_attentions``, the probabilities
        ``[b, H, q, k]``; ``bias`` ``[H, q, k]`` (or ``[b, H, q, k]``) and ``scale`` ``[H, q, k]`` float32."""
        batch, seq, width = hidden.shape
        qkv = self.query_key_value(hidden).view(batch, seq, self.num_heads, 3 * self.head_dim).transpose(1, 2)
        query, key, value = qkv.split(self.head_dim, dim=-1)  # each [b, H, s, d]
        query, key = positional.rotate(query, key, inputs.positions)
        increments = positional.layer_increments(self.layer_index, hidden)  # [b, H, s] (CABLE) or None
        if increments is not None:  # one more key channel, so that the cache keeps them with the keys
            key = torch.cat([key, increments[..., None].to(key.dtype)], dim=-1)
        if inputs.cache is not None:
            key, value = inputs.cache.update(key, value, self.layer_index)  # [b, H, k, d (+ 1)]
        layer_bias = None
        if increments is not None:
            sums = key[..., -1].float().cumsum(dim=-1)  # [b, H, k]: s_t over every key so far
            key = key[..., :-1]
            layer_bias = sums[..., -seq:, None] - sums[..., None, :]  # [b, H, q, k]: s_i - s_j
        if getattr(self.config, "_attn_implementation", "eager") == "sdpa" and scale is None and not inputs.output_attentions:
            mask = torch.zeros(inputs.allowed.shape, dtype=torch.float32, device=query.device)
            mask = mask.masked_fill(~inputs.allowed, float("-inf"))  # [b or 1, 1, q, k]
            for term in (bias, layer_bias):
                if term is not None:
                    mask = mask + term  # [b or 1, H, q, k]
            output = F.scaled_dot_product_attention(query.float(), key.float(), value.float(), attn_mask=mask)
            output = output.to(value.dtype).transpose(1, 2).reshape(batch, seq, width)
            return self.dense(output), None
        scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        if scale is not None:
            scores = scores * scale
        if bias is not None:
            scores = scores + bias
        if layer_bias is not None:
            scores = scores + layer_bias
        scores = scores.masked_fill(~inputs.allowed, float("-inf"))  # [b, H, q, k]
        probs = torch.softmax(scores, dim=-1).to(value.dtype)
        output = torch.matmul(probs, value).transpose(1, 2).reshape(batch, seq, width)
        return self.dense(output), probs if inputs.output_attentions else None


class KerpleMLP(nn.Module):
    def __init__(self, config: KerpleConfig) -> None:
        super().__init__()
        if config.hidden_act not in ACTIVATIONS:
            raise ValueError(f"config.hidden_act {config.hidden_act!r}: expected one of {sorted(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[config.hidden_act]
        self.dense_h_to_4h = nn.Linear(config.hidden_size, config.intermediate_size)
        self.dense_4h_to_h = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(hidden)))


class KerpleLayer(nn.Module):
    """Pre-LN layer, sequential residual or GPT-J's parallel one (``use_parallel_residual``)."""

    def __init__(self, config: KerpleConfig, layer_index: int) -> None:
        super().__init__()
        self.use_parallel_residual = config.use_parallel_residual
        self.input_layernorm = build_norm(config)
        self.attention = KerpleAttention(config, layer_index)
        self.post_attention_layernorm = build_norm(config)
        self.mlp = KerpleMLP(config)

    def forward(
        self,
        hidden: torch.Tensor,
        bias: torch.Tensor | None,
        scale: torch.Tensor | None,
        inputs: AttentionInputs,
        positional: KerplePositional,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attention_out, probs = self.attention(self.input_layernorm(hidden), bias, scale, inputs, positional)
        if self.use_parallel_residual:
            return hidden + (attention_out + self.mlp(self.post_attention_layernorm(hidden))), probs
        hidden = hidden + attention_out
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), probs


class KerplePreTrainedModel(PreTrainedModel):
    config_class = KerpleConfig
    base_model_prefix = "gpt_neox"
    _no_split_modules = ["KerpleLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True  # the bias as a float mask (KerpleAttention); a weight term runs eager math
    supports_gradient_checkpointing = True
    # kerple keeps its positional tensors in float32 under bf16/fp16 too
    _keep_in_fp32_modules_strict = ["positional"]

    def _init_weights(self, module: nn.Module) -> None:
        """Only for weights a folder lacks: transformers' defaults, ones for the norms' gains."""
        super()._init_weights(module)
        if isinstance(module, RMSNorm):
            module.scale.data.fill_(1.0)
        elif isinstance(module, ScaleNorm):
            module.g.data.fill_(1.0)


class KerpleModel(KerplePreTrainedModel):
    """Token embeddings, the positional embedding, the layers and the final norm."""

    def __init__(self, config: KerpleConfig) -> None:
        super().__init__(config)
        self.embed_in = nn.Embedding(config.vocab_size, config.hidden_size)
        self.positional = KerplePositional(config)
        self.layers = nn.ModuleList(KerpleLayer(config, index) for index in range(config.num_hidden_layers))
        self.final_layer_norm = build_norm(config)
        self.gradient_checkpointing = False  # set by transformers' gradient_checkpointing_enable()
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_in

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_in = value

    def _allowed(self, query_index: torch.Tensor, k_len: int, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Bool ``[b or 1, 1, q, k]``: causal, within ``attention_window``, and not a padded key (a
        padded query still sees itself, so no row is empty)."""
        signed = query_index[:, None] - torch.arange(k_len, device=query_index.device)[None, :]  # [q, k]
        allowed = signed >= 0
        if self.config.attention_window is not None:
            allowed = allowed & (signed < self.config.attention_window)
        if attention_mask is None:
            return allowed[None, None]
        if attention_mask.dim() != 2 or attention_mask.shape[-1] != k_len:
            raise ValueError(f"attention_mask must be [batch, {k_len}] (past and new tokens), got {tuple(attention_mask.shape)}")
        keys = attention_mask.to(device=query_index.device, dtype=torch.bool)[:, None, None, :]  # [b, 1, 1, k]
        return allowed[None, None] & (keys | (signed == 0))

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast | tuple:
        """The final hidden states ``[b, s, h]`` and the cache; with ``output_hidden_states``, the input of
        every layer and the final (normed) output; with ``output_attentions``, every layer's
        probabilities ``[b, H, q, k]``; a tuple with ``return_dict=False``."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        config = self.config
        if output_attentions is None:
            output_attentions = getattr(config, "output_attentions", False)
        if output_hidden_states is None:
            output_hidden_states = getattr(config, "output_hidden_states", False)
        return_dict = getattr(config, "return_dict", True) if return_dict is None else return_dict
        hidden = self.embed_in(input_ids) if inputs_embeds is None else inputs_embeds  # [b, s, h]
        use_cache = config.use_cache if use_cache is None else use_cache
        checkpointing = self.gradient_checkpointing and self.training
        if checkpointing:
            use_cache = False  # the recomputation would append to the cache a second time
        cache = (past_key_values if past_key_values is not None else DynamicCache()) if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        query_index = torch.arange(past, past + hidden.shape[1], device=hidden.device)  # absolute indices
        if position_ids is None:
            position_ids = query_index[None].expand(hidden.shape[0], -1)
        hidden = self.positional.embed(hidden, position_ids)
        bias = self.positional.logit_term("bias", query_index, past + hidden.shape[1], position_ids)
        scale = self.positional.logit_term("weight", query_index, past + hidden.shape[1], position_ids)
        inputs = AttentionInputs(
            positions=position_ids,
            allowed=self._allowed(query_index, past + hidden.shape[1], attention_mask),
            cache=cache,
            output_attentions=bool(output_attentions),
        )
        all_hidden: tuple[torch.Tensor, ...] = ()
        all_attentions: tuple[torch.Tensor, ...] = ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden,)
            if checkpointing:
                hidden, probs = self._gradient_checkpointing_func(layer.__call__, hidden, bias, scale, inputs, self.positional)
            else:
                hidden, probs = layer(hidden, bias, scale, inputs, self.positional)
            if output_attentions:
                all_attentions += (probs,)
        hidden = self.final_layer_norm(hidden)
        if output_hidden_states:
            all_hidden += (hidden,)
        output = BaseModelOutputWithPast(
            last_hidden_state=hidden,
            past_key_values=cache,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


class KerpleForCausalLM(KerplePreTrainedModel, GenerationMixin):
    """:class:`KerpleModel` and the LM head ``embed_out`` (tied to ``embed_in`` when the config says so)."""

    _tied_weights_keys = {"embed_out.weight": "gpt_neox.embed_in.weight"}

    def __init__(self, config: KerpleConfig) -> None:
        super().__init__(config)
        self.gpt_neox = KerpleModel(config)
        self.embed_out = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.gpt_neox.embed_in

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.gpt_neox.embed_in = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.embed_out

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.embed_out = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits ``[b, s, vocab]`` (the last ``logits_to_keep`` positions when it is set); with
        ``labels``, the shifted next-token loss; hidden states and attentions as :class:`KerpleModel`
        gives them; a tuple with ``return_dict=False``."""
        return_dict = getattr(self.config, "return_dict", True) if return_dict is None else return_dict
        outputs = self.gpt_neox(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden = outputs.last_hidden_state
        logits = self.embed_out(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        output = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values,
                                        hidden_states=outputs.hidden_states, attentions=outputs.attentions)
        return output if return_dict else output.to_tuple()
