"""``rotary``: rotary position embedding (Su et al. 2021) in GPT-NeoX's layout (docs/reference-format.md §3).

The first ``rotary_ndims = int(head_dim * rotary_pct)`` channels of every query and key are
rotated; the rest pass through. Within the rotated part the "rotate_half" layout pairs channel
``c`` with channel ``c + rotary_ndims/2`` (halves concatenated, not interleaved):

    x' = x * cos(t * θ) + rotate_half(x) * sin(t * θ),   rotate_half([x1, x2]) = [-x2, x1],
    θ = cat(inv_freq, inv_freq),   inv_freq = 1 / base ** (arange(0, rotary_ndims, 2) / rotary_ndims).

``rope_scaling`` (``{rope_type: yarn, factor: 4, original_max_position_embeddings: 512}``, spelled as
``transformers``' ``rope_parameters``) replaces ``inv_freq`` in the rotation by the frequencies of a
context-extension method and multiplies cos and sin by its attention factor, both computed by
``transformers`` (:mod:`kerple.positional.rope_scaling`). The stored ``inv_freq`` stays the base
frequencies, so a checkpoint trained without scaling loads into a model with it and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kerple.positional.base import ModelShape, PositionalEmbedding, PositionKind
from kerple.positional.options import Variant, option
from kerple.positional.rope_scaling import (
    KERPLE_KEYS,
    METHOD_NAMES,
    NO_SCALING,
    ROPE_KEYS,
    RopeFrequencies,
    method_tag,
    rope_parameters,
    rope_scaling_problem,
    transformers_max_positions,
)


@dataclass(frozen=True)
class RotaryOptions:
    """Options of ``rotary``."""

    rotary_pct: float = option(1.0, "Fraction of each head's dimensions rotated (rotary).", minimum=0.0, maximum=1.0)
    rotary_emb_base: float = option(10000.0, "Base of the rotary frequencies.", minimum=1.0)
    rope_scaling: dict | None = option(
        None,
        "RoPE context extension as transformers spells rope_parameters, e.g. {rope_type: yarn, factor: 4, "
        "original_max_position_embeddings: 512}; rope_type one of default, linear (Position Interpolation), "
        "dynamic (dynamic NTK), yarn, longrope, llama3, proportional; computed by transformers' "
        "ROPE_INIT_FUNCTIONS (docs/context-extension.md).",
        refuse_elsewhere=True,
        weights_bound=False,
        variant=Variant(tag=method_tag, names=METHOD_NAMES, unset=({"rope_type": NO_SCALING},)),
    )


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (halves concatenated)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class RotaryEmbedding(PositionalEmbedding):
    """Rotary embedding; buffer ``inv_freq`` ``[rotary_ndims/2]`` stored as ``rotary_emb.inv_freq``.

    ``rotated_ndims`` channels of each head are rotated: ``rotary_ndims``, except under
    ``proportional`` RoPE, whose frequencies span the whole head (those past ``rotary_ndims`` are 0).
    Rotation is computed in fp32 and cast back to the query dtype (the reference builds its cos/sin
    cache in the compute dtype; fp32 is slightly more accurate in bf16 runs).
    """

    kind = PositionKind.QUERY_KEY
    state_dict_name = "rotary_emb"
    options_class = RotaryOptions

    def __init__(self, shape: ModelShape, options: RotaryOptions = RotaryOptions()) -> None:
        super().__init__(shape)
        rotary_pct = options.rotary_pct
        if not 0.0 < rotary_pct <= 1.0:
            raise ValueError(f"rotary_pct must be in (0, 1], got {rotary_pct}")
        self.rotary_ndims = int(shape.head_dim * rotary_pct)
        if self.rotary_ndims < 2 or self.rotary_ndims % 2:
            raise ValueError(
                f"rotary dims int(head_dim * rotary_pct) = {self.rotary_ndims} must be even and >= 2 "
                f"(head_dim={shape.head_dim}, rotary_pct={rotary_pct})"
            )
        self.base = float(options.rotary_emb_base)
        exponents = torch.arange(0, self.rotary_ndims, 2, dtype=torch.float32) / self.rotary_ndims
        self.register_buffer("inv_freq", 1.0 / (self.base**exponents))
        self.rope_frequencies = scaled_frequencies(options, head_dim=shape.head_dim, max_positions=shape.max_positions)
        self.rotated_ndims = self.rotary_ndims
        if self.rope_frequencies is not None:  # proportional RoPE rotates the whole head
            self.rotated_ndims = 2 * self.rope_frequencies.at(shape.max_positions, self.inv_freq.device)[0].numel()

    @classmethod
    def options_problem(cls, options: RotaryOptions, shape: ModelShape) -> tuple[str, str] | None:
        """The rotated width against this shape, then ``rope_scaling`` (the rules of ``transformers``' validator)."""
        width = rotary_width_problem(shape.head_dim, float(options.rotary_pct))
        if width is not None:
            return "rotary_pct", width
        if options.rope_scaling is None:
            return None
        problem = rope_scaling_problem(
            options.rope_scaling, head_dim=shape.head_dim, max_positions=shape.max_positions,
            rotary_pct=float(options.rotary_pct), base=float(options.rotary_emb_base),
        )
        return None if problem is None else ("rope_scaling", problem)

    def frequencies(self, length: int) -> tuple[torch.Tensor, float]:
        """``(inv_freq [rotated_ndims/2], attention factor)`` of a forward over positions ``< length``:
        the stored base frequencies and 1, or those of ``rope_scaling`` at that length."""
        if self.rope_frequencies is None:
            return self.inv_freq.float(), 1.0
        return self.rope_frequencies.at(length, self.inv_freq.device)

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = self.rope_frequencies
        length = int(positions.max()) + 1 if scaled is not None and scaled.length_dependent and positions.numel() else 0
        inv_freq, factor = self.frequencies(length)
        angles = positions.to(device=inv_freq.device, dtype=torch.float32)[:, None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)  # [s, rotated_ndims]
        if factor == 1.0:
            return angles.cos(), angles.sin()
        return angles.cos() * factor, angles.sin() * factor  # transformers' attention_scaling (YaRN's sqrt(1/t))

    def _rotate_one(self, x: torch.Tensor, positions: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """The rotated channels of ``x [b, H, s, head_dim]``, each then multiplied by ``scale [s, rotated_ndims]``
        when given (xPos), in float32; the other channels pass through."""
        cos, sin = self._cos_sin(positions)
        rotated, passed = x[..., : self.rotated_ndims], x[..., self.rotated_ndims :]
        rotated = rotated.float()
        rotated = rotated * cos + rotate_half(rotated) * sin  # [b, H, s, rotated_ndims]
        if scale is not None:
            rotated = rotated * scale
        return torch.cat([rotated.to(x.dtype), passed], dim=-1)

    def rotate(
        self, query: torch.Tensor, key: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``query``/``key`` ``[b, H, s, head_dim]`` by their absolute positions ``[s]``."""
        return self._rotate_one(query, q_positions), self._rotate_one(key, k_positions)

    def export_terms(self) -> dict[str, dict[str, Any]]:
        refuse_rope_scaling(self)
        return {"query_key": {"form": "rotary", "inv_freq": {"tensor": "inv_freq"}}}


def rotary_width_problem(head_dim: int, rotary_pct: float) -> str | None:
    """Why ``int(head_dim * rotary_pct)`` channels cannot be rotated in pairs (odd, or under 2), with
    the settings that would fix it; ``None`` when they can."""
    width = int(head_dim * rotary_pct)
    if width >= 2 and width % 2 == 0:
        return None
    even = next((n for n in range(min(width, head_dim), 1, -1) if n % 2 == 0), None)
    fixes = [] if even is None else [f"a rotary_pct giving an even width (e.g. {_pct_for(even, head_dim)}: {even} channels)"]
    if even is None and head_dim >= 2:
        fixes.append(f"rotary_pct to at least {_pct_for(2, head_dim)}")
    if head_dim % 2:
        fixes.append("hidden_size / num_attention_heads even")
    return (f"rotates int(head_dim x rotary_pct) = int({head_dim} x {rotary_pct}) = {width} channels of each head "
            f"(head_dim = hidden_size / num_attention_heads); rotary needs an even number, at least 2: set "
            f"{' or '.join(fixes)}")


def _pct_for(width: int, head_dim: int) -> str:
    """A short ``rotary_pct`` that rotates exactly ``width`` of ``head_dim`` channels."""
    short = f"{width / head_dim:.4g}"
    return short if int(head_dim * float(short)) == width else f"{(width + 0.5) / head_dim:.4g}"


def scaled_frequencies(options: RotaryOptions, *, head_dim: int, max_positions: int) -> RopeFrequencies | None:
    """The ``rope_scaling`` frequencies of ``options``, or ``None`` when there is none (or ``default``)."""
    rope_scaling = options.rope_scaling
    if rope_scaling is None or rope_scaling.get("rope_type") == NO_SCALING:
        return None
    return RopeFrequencies.build(
        rope_scaling, head_dim=head_dim, rotary_pct=float(options.rotary_pct), base=float(options.rotary_emb_base),
        max_positions=max_positions,
    )


def refuse_rope_scaling(module: RotaryEmbedding) -> None:
    """``KerpleForCausalLM``'s query/key forms take fixed frequencies: a scaled rotary model exports as
    stock GPTNeoX, a scaled xPos model only without its scaling (a run-time option: the weights are the same)."""
    if module.rope_frequencies is None:
        return
    if type(module) is RotaryEmbedding:
        raise NotImplementedError(
            "its rotary form takes fixed frequencies, not rope_scaling; a rotary model with rope_scaling exports as "
            "stock GPTNeoXForCausalLM, whose config holds it: leave out --hf-target kerple (or give --hf-target gpt_neox)"
        )
    raise NotImplementedError(
        "its query/key forms take fixed frequencies, not rope_scaling, and no stock class computes them; export the "
        "weights without the scaling (--config 'rope_scaling=null'): it is a run-time option, the weights are the same"
    )


def extension_options(rope_type: str, factor: float, original_length: int) -> dict[str, Any]:
    """The config keys that extend a rotary model trained at ``original_length`` by ``factor`` with
    ``rope_type``'s method (``linear``: Position Interpolation; ``yarn``, which names the original length)."""
    scaling: dict[str, Any] = {"rope_type": rope_type, "factor": float(factor)}
    if "original_max_position_embeddings" in ROPE_KEYS[rope_type][0]:
        scaling["original_max_position_embeddings"] = original_length
    return {"rope_scaling": scaling}


def gpt_neox_config(config: dict[str, Any], *, rotary_pct: float, max_positions: int) -> dict[str, Any]:
    """The rotary keys of a stock GPTNeoX ``config.json`` for the flat kerple ``config`` (its
    ``rotary_emb_base`` and ``rope_scaling``) rotating ``rotary_pct`` of each head (0: NoPE) at
    ``max_positions``: ``max_position_embeddings`` as ``transformers`` reads it
    (:func:`transformers_max_positions`), ``rotary_pct``, ``rotary_emb_base``, ``rope_parameters``
    and, with a scaling, ``rope_scaling`` (the key transformers 4 reads)."""
    rope_scaling = config.get("rope_scaling")
    base = float(config.get("rotary_emb_base", 10000.0))
    rope = rope_parameters(rope_scaling, rotary_pct=rotary_pct, base=base)
    scaling = {"rope_scaling": {key: value for key, value in rope.items() if key not in KERPLE_KEYS}} if rope_scaling else {}
    return {"max_position_embeddings": transformers_max_positions(rope_scaling, max_positions),
            "rotary_pct": rotary_pct, "rotary_emb_base": base, "rope_parameters": rope, **scaling}


def from_gpt_neox_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The kerple options of a stock GPTNeoX ``config.json``'s rotary keys (``rope_parameters``, or
    transformers 4's ``rope_scaling``, ``rotary_pct``, ``rotary_emb_base``): ``pos_emb`` (``none``
    where nothing is rotated), ``rotary_pct``, ``rotary_emb_base``, ``rope_scaling``."""
    rope = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    pct = float(rope.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
    scaling = {key: value for key, value in rope.items() if key not in KERPLE_KEYS}
    scaling["rope_type"] = scaling.pop("type", scaling.get("rope_type", NO_SCALING))
    return {
        "pos_emb": "none" if pct == 0.0 else "rotary",
        "rotary_pct": pct if pct > 0 else 1.0,
        "rotary_emb_base": float(rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0))),
        "rope_scaling": None if scaling["rope_type"] == NO_SCALING else scaling,
    }
