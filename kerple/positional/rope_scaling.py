"""RoPE context extension (``rope_scaling``), computed by ``transformers``' own initialisers.

A rotary model trained at length L reads longer inputs better when its frequencies are rescaled.
The methods, by ``rope_type`` (the spelling of ``transformers``' ``rope_parameters``):

* ``linear``: Position Interpolation (Chen et al. 2023, arXiv 2306.15595, §2.3: positions are
  divided by the factor s, ``f'(x, m) = f(x, m/s)``, equivalently every frequency by s).
* ``dynamic``: dynamic NTK-aware scaling (the YaRN paper, Peng et al. 2023, arXiv 2309.00071, §3,
  "NTK-aware" and "Dynamic NTK" interpolation): the base becomes ``b·(s·l/L − (s − 1))^(d/(d−2))``
  at the current length ``l > L``, and is unchanged up to L.
* ``yarn``: YaRN (the same paper, §3: "NTK-by-parts" interpolation and the attention scaling of
  YaRN itself): frequencies with wavelengths longer than the context are interpolated, short ones
  kept, a ramp between (``beta_fast``, ``beta_slow``); and the attention logits are multiplied by
  ``1/t = (0.1·ln s + 1)²``.
* ``llama3``: Llama 3.1's frequency-dependent scaling (Meta's reference code; ``low_freq_factor``,
  ``high_freq_factor``): the same three bands as YaRN's, split by wavelength against the original length.
* ``longrope``: LongRoPE (Ding et al. 2024, arXiv 2402.13753): a searched rescale factor per
  frequency, ``short_factor`` up to ``original_max_position_embeddings`` and ``long_factor`` beyond,
  and the logits multiplied by ``1 + ln s / ln L``.
* ``proportional``: ``transformers``' proportional RoPE (frequencies over the whole head, the
  unrotated part given frequency 0), then divided by ``factor``.
* ``default``: none (the same as no ``rope_scaling``).

The frequencies and the attention factor come from ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``
applied to a stock ``GPTNeoXConfig`` of the same rotary settings (:func:`transformers_config`), so a
kerple model and the ``GPTNeoXForCausalLM`` it exports to agree by construction. The length-dependent
types (``dynamic``, ``longrope``: those ``transformers``' ``dynamic_rope_update`` updates) are
evaluated at every forward at ``l = 1 + the largest position``, as that update does; where
``transformers`` keeps the largest length seen until a forward shorter than the original length
(its cache), kerple recomputes from each forward's own length, so the two agree whenever the
lengths of successive forwards do not shrink (one forward, decoding, evaluation by increasing length).

The attention factor multiplies the rotated channels' cosines and sines, as ``transformers`` does:
the queries' and keys' rotated parts each by the factor, so the logits by its square (with
``rotary_pct: 1`` exactly YaRN's temperature ``1/t`` on the scores). It acts before every
kernel (eager, sdpa, flex) and the KV cache, like the rotation.

The checks (:func:`rope_scaling_problem`) are kerple's own statement of the rules of
``transformers``' validator (``RotaryEmbeddingConfigMixin.validate_rope``: the keys each type takes,
``factor >= 1``, list lengths, ``high_freq_factor > low_freq_factor``, ...), stated once in
:data:`ROPE_KEYS` and :func:`_value_rules`, plus the values its initialisers divide by or take the
logarithm of (an original length of 0, a ``beta`` or ``low_freq_factor`` of 0) and non-finite
numbers, which it accepts. Only its public pieces are used: ``ROPE_INIT_FUNCTIONS``, the
``RopeParameters`` type hints and ``GPTNeoXConfig``. A config that passes the checks is one
``transformers``' validator accepts without a warning (the tests hold the two together), because
``max_position_embeddings`` is handed over as ``transformers`` reads it (:func:`transformers_max_positions`).

``transformers`` is imported only when a model sets ``rope_scaling``.
"""

from __future__ import annotations

import copy
import difflib
import math
import typing
from dataclasses import dataclass
from typing import Any

import torch

NO_SCALING = "default"
KERPLE_KEYS = {"rope_theta": "rotary_emb_base", "partial_rotary_factor": "rotary_pct"}
"""``rope_parameters`` keys that kerple's own options set; ``rope_scaling`` may not repeat them."""
ROPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    NO_SCALING: ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "longrope": (("factor", "original_max_position_embeddings", "short_factor", "long_factor"), ("attention_factor",)),
    "llama3": (("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"), ()),
    "proportional": ((), ()),
}
"""``rope_type`` -> (required keys, optional keys) besides ``rope_type``: those of ``transformers``'
validator, except that ``longrope`` needs ``factor`` (without it ``transformers`` derives the factor
from ``max_position_embeddings``, which it reads as the extended length and kerple as the model's own)."""


METHOD_NAMES = {
    "linear": "PI",
    "dynamic": "dynamic NTK",
    "yarn": "YaRN",
    "llama3": "Llama 3",
    "longrope": "LongRoPE",
    "proportional": "proportional",
}
"""``rope_type`` -> the method's name in result tables ("Rotary + YaRN"), in the order they list them."""


def method_tag(rope_scaling: Any) -> str | None:
    """The ``rope_type`` of a ``rope_scaling`` value, ``None`` for none (a run's variant tag)."""
    rope_type = rope_scaling.get("rope_type", NO_SCALING) if isinstance(rope_scaling, dict) else NO_SCALING
    return None if rope_type == NO_SCALING else str(rope_type)


def rope_types() -> tuple[str, ...]:
    """Every ``rope_type`` kerple takes: ``default`` and those of the installed ``transformers``'
    ``ROPE_INIT_FUNCTIONS`` whose rules :data:`ROPE_KEYS` states."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return tuple(name for name in (NO_SCALING, *ROPE_INIT_FUNCTIONS) if name in ROPE_KEYS)


def length_dependent(rope_type: str) -> bool:
    """Whether the frequencies change with the forward's length (``transformers``' ``dynamic_rope_update``
    updates ``"dynamic"`` types and ``longrope``)."""
    return "dynamic" in rope_type or rope_type == "longrope"


def transformers_max_positions(rope_scaling: dict[str, Any] | None, max_positions: int) -> int:
    """``max_position_embeddings`` as ``transformers`` reads it for ``rope_scaling`` on a model of
    ``max_positions``: the model's own length for the types that scale from it (``dynamic``), the
    extended length ``original_max_position_embeddings × factor`` for those that name the original
    one (``yarn``, ``llama3``, ``longrope``). Their frequencies do not depend on it; its validator
    wants it above the original length (``llama3``) and, for ``yarn``, at ``factor`` or 1 times it."""
    original = (rope_scaling or {}).get("original_max_position_embeddings")
    if original is None:
        return max_positions
    extended = original * float(rope_scaling.get("factor", 1.0))  # type: ignore[union-attr]
    if extended.is_integer() and extended > original and extended / original == rope_scaling.get("factor"):  # type: ignore[union-attr]
        return int(extended)
    return original if rope_scaling.get("rope_type") == "yarn" else math.floor(extended) + 1  # type: ignore[union-attr]


def _as_transformers_spells(rope_scaling: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``rope_scaling`` with the whole numbers of float-typed keys as floats (its yarn
    validator wants ``attention_factor`` a float)."""
    hints = _hints()
    return {key: float(value) if _allowed(hints.get(key)) == [float] and type(value) is int else copy.deepcopy(value)
            for key, value in rope_scaling.items()}


def transformers_config(
    rope_scaling: dict[str, Any], *, head_dim: int, rotary_pct: float, base: float, max_positions: int
) -> Any:
    """The stock ``GPTNeoXConfig`` whose rotary embedding is kerple's: one head of ``head_dim``,
    ``rotary_pct``, ``base``, ``rope_scaling`` and ``max_position_embeddings`` as transformers reads
    it for a model of ``max_positions`` (:func:`transformers_max_positions`)."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        hidden_size=head_dim, num_attention_heads=1, rotary_pct=rotary_pct, rotary_emb_base=base,
        max_position_embeddings=transformers_max_positions(rope_scaling, max_positions),
        rope_scaling=_as_transformers_spells(rope_scaling),
    )


def rope_parameters(rope_scaling: dict[str, Any] | None, *, rotary_pct: float, base: float) -> dict[str, Any]:
    """``config.json["rope_parameters"]`` of a stock GPTNeoX export: the base settings plus ``rope_scaling``."""
    scaling = _as_transformers_spells(rope_scaling) if rope_scaling else {}
    return {"rope_type": NO_SCALING, "rope_theta": base, "partial_rotary_factor": rotary_pct, **scaling}


_TYPE_NAMES = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}


def _hints() -> dict[str, Any]:
    from transformers.modeling_rope_utils import RopeParameters

    return typing.get_type_hints(RopeParameters)


def _allowed(hint: Any) -> list[Any]:
    if hint is None:
        return []
    return [arg for arg in typing.get_args(hint) if arg is not type(None)] or [hint]


def _value_problem(key: str, value: Any) -> str | None:
    """Whether ``value`` has the type ``transformers``' ``RopeParameters`` declares for ``key``."""
    allowed = _allowed(_hints().get(key))
    for hint in allowed:
        if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if hint in (int, bool, str) and type(value) is hint:
            return None
        if typing.get_origin(hint) is list and isinstance(value, list) and all(
            isinstance(item, (int, float)) and not isinstance(item, bool) for item in value
        ):
            return None
    names = " or ".join(_TYPE_NAMES.get(h, "a list of numbers") for h in allowed)
    return f"rope_scaling.{key} must be {names}, got {value!r}"


def _unknown_keys_problem(keys: list[str]) -> str:
    known = [key for key in _hints() if key not in KERPLE_KEYS]
    guesses = [difflib.get_close_matches(key, known, n=1) for key in keys]
    hint = "".join(f"; did you mean {guess[0]!r} for {key!r}?" for key, guess in zip(keys, guesses) if guess)
    return f"unknown key(s) {', '.join(map(repr, keys))} in rope_scaling{hint}"


def _keys_problem(rope_scaling: dict[str, Any]) -> str | None:
    """The keys: known to ``RopeParameters``, not kerple's own options, those the ``rope_type`` takes."""
    rope_type = rope_scaling["rope_type"]
    for key, option in KERPLE_KEYS.items():
        if key in rope_scaling:
            return f"rope_scaling.{key} is kerple's {option}; set that option instead"
    unknown = [str(key) for key in rope_scaling if key not in _hints()]
    if unknown:
        return _unknown_keys_problem(unknown)
    required, optional = ROPE_KEYS[rope_type]
    missing = [key for key in required if key not in rope_scaling]
    if missing:
        return f"rope_scaling with rope_type {rope_type!r} needs {', '.join(missing)}"
    extra = [key for key in rope_scaling if key not in (*required, *optional, "rope_type")]
    if extra:
        takes = ", ".join((*required, *optional)) or "no other key"
        return f"rope_scaling with rope_type {rope_type!r} takes no {', '.join(extra)} (it takes {takes})"
    for key, value in rope_scaling.items():
        problem = _value_problem(str(key), value)
        if problem:
            return problem
    return None


def _value_rules(rope_scaling: dict[str, Any], rotated_pairs: int) -> str | None:
    """The value rules of ``transformers``' validator, and those of the values its initialisers divide
    by or take the logarithm of; ``rotated_pairs`` is the number of rotary frequencies."""
    for key, value in rope_scaling.items():
        numbers = value if isinstance(value, list) else [value]
        if any(isinstance(number, float) and not math.isfinite(number) for number in numbers):
            return f"rope_scaling.{key} must be finite, got {value!r}"
    at_least_one = {"factor": "1 (1: no extension)", "original_max_position_embeddings": "1 (the length trained at)"}
    for key, least in at_least_one.items():
        if key in rope_scaling and rope_scaling[key] < 1:
            return f"rope_scaling.{key} must be at least {least}, got {rope_scaling[key]!r}"
    for key in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "low_freq_factor"):
        if key in rope_scaling and rope_scaling[key] <= 0:
            return f"rope_scaling.{key} must be above 0, got {rope_scaling[key]!r}"
    pairs = (("beta_fast", "beta_slow", 32, 1, "at least"), ("high_freq_factor", "low_freq_factor", None, None, "above"))
    for upper, lower, upper_default, lower_default, relation in pairs:
        high, low = rope_scaling.get(upper, upper_default), rope_scaling.get(lower, lower_default)
        if high is not None and low is not None and (high < low if relation == "at least" else high <= low):
            return f"rope_scaling.{upper} ({high}) must be {relation} {lower} ({low})"
    for key in ("short_factor", "long_factor"):
        factors = rope_scaling.get(key)
        if factors is not None and len(factors) != rotated_pairs:
            return (f"rope_scaling.{key} must have length {rotated_pairs} (one per rotary frequency: "
                    f"int(head_dim x rotary_pct) / 2), got {len(factors)}")
        if factors is not None and min(factors) <= 0:
            return f"rope_scaling.{key} must hold numbers above 0, got {min(factors)!r}"
    return None


def rope_scaling_problem(
    rope_scaling: Any, *, head_dim: int, rotary_pct: float, base: float, max_positions: int
) -> str | None:
    """What is wrong with ``rope_scaling`` for a rotary model of this shape, naming the key; ``None`` if nothing.

    The ``rope_type`` must be one :func:`rope_types` lists, with the keys :data:`ROPE_KEYS` gives it,
    each value of the type ``transformers``' ``RopeParameters`` declares and within
    :func:`_value_rules`; then the frequencies ``transformers`` computes must be finite and above 0
    (``proportional`` gives the unrotated channels 0), at the model's length and beyond it.
    """
    if not isinstance(rope_scaling, dict):
        return f"rope_scaling must be a mapping such as {{rope_type: yarn, factor: 4}}, got {rope_scaling!r}"
    rope_type = rope_scaling.get("rope_type")
    if rope_type not in rope_types():
        got = "no rope_type" if rope_type is None else f"rope_type {rope_type!r}"
        if rope_type is None and "type" in rope_scaling:
            got += " (the key is rope_type: transformers' older spelling 'type' is not read)"
        return f"rope_scaling needs rope_type: one of {', '.join(rope_types())}; got {got}"
    problem = _keys_problem(rope_scaling) or _value_rules(rope_scaling, int(head_dim * rotary_pct) // 2)
    if problem or rope_type == NO_SCALING:
        return problem
    frequencies = RopeFrequencies.build_unchecked(
        rope_scaling, head_dim=head_dim, rotary_pct=rotary_pct, base=base, max_positions=max_positions
    )
    rotated = int(rotary_pct * head_dim // 2) if rope_type == "proportional" else None
    original = int(rope_scaling.get("original_max_position_embeddings") or max_positions)
    for length in sorted({max_positions, 4 * max(original, max_positions)}):
        inv_freq, factor = frequencies.at(length)
        bad = int((~torch.isfinite(inv_freq)).sum() + (inv_freq[:rotated] <= 0).sum())
        if bad or not (math.isfinite(factor) and factor > 0):
            return (f"rope_scaling gives {bad} of {inv_freq.numel()} rotary frequencies 0 or not finite and the "
                    f"attention factor {factor} at length {length}; lower factor")
    return None


def _init_function(rope_type: str) -> Any:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[rope_type]


@dataclass
class RopeFrequencies:
    """The scaled rotary frequencies of one model and its attention factor, at any length.

    ``at(length, device)`` returns ``(inv_freq [r/2] float32, attention_factor)`` from ``transformers``'
    initialiser for this ``rope_type``: once for the fixed types, at every new length for the
    length-dependent ones (the last result is kept, as every layer of a forward asks for it). They are
    computed on the CPU, whatever device new tensors default to (a model built on the meta device by
    ``train.py --dry-run``), then moved to ``device``.
    """

    rope_type: str
    config: Any  # transformers.GPTNeoXConfig
    _last: tuple[tuple[int, torch.device], torch.Tensor, float] | None = None

    @property
    def length_dependent(self) -> bool:
        """Whether :meth:`at` depends on the length (``dynamic``, ``longrope``)."""
        return length_dependent(self.rope_type)

    @classmethod
    def build(
        cls, rope_scaling: dict[str, Any], *, head_dim: int, rotary_pct: float, base: float, max_positions: int
    ) -> RopeFrequencies:
        """Check ``rope_scaling`` (``ValueError`` naming the key) and build its frequencies."""
        problem = rope_scaling_problem(
            rope_scaling, head_dim=head_dim, rotary_pct=rotary_pct, base=base, max_positions=max_positions
        )
        if problem:
            raise ValueError(problem)
        return cls.build_unchecked(rope_scaling, head_dim=head_dim, rotary_pct=rotary_pct, base=base,
                                   max_positions=max_positions)

    @classmethod
    def build_unchecked(
        cls, rope_scaling: dict[str, Any], *, head_dim: int, rotary_pct: float, base: float, max_positions: int
    ) -> RopeFrequencies:
        """The frequencies of a ``rope_scaling`` whose keys and values passed the checks."""
        config = transformers_config(
            rope_scaling, head_dim=head_dim, rotary_pct=rotary_pct, base=base, max_positions=max_positions
        )
        return cls(rope_type=str(rope_scaling["rope_type"]), config=config)

    def at(self, length: int, device: torch.device | None = None) -> tuple[torch.Tensor, float]:
        """``(inv_freq, attention_factor)`` on ``device`` for a forward whose largest position is ``length - 1``."""
        key = (length if self.length_dependent else 0, torch.device(device or "cpu"))
        if self._last is None or self._last[0] != key:
            with torch.device("cpu"):
                # the length as transformers' dynamic_rope_update passes it: an int64 tensor, max(position_ids) + 1
                seq_len = torch.tensor(key[0]) if key[0] else None
                inv_freq, factor = _init_function(self.rope_type)(self.config, None, seq_len=seq_len)
            self._last = (key, inv_freq.float().to(key[1]), float(factor))
        return self._last[1], self._last[2]
