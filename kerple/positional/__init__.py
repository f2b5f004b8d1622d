"""Every positional embedding of the papers behind one registry (one line per name).

``build(name, ...)`` is the only entry point the model needs; adding an embedding means one new
class (see :mod:`kerple.positional.base`) and one line in ``_REGISTRY``. Reference ``pos_emb``
strings of the GPT-NeoX KERPLE fork (docs/reference-format.md §1) resolve through ``_ALIASES``.
"""

from __future__ import annotations

import inspect
from typing import Any

from kerple.positional.absolute import LearnedPositionalEmbedding, NoPositionalEmbedding, SinusoidalPositionalEmbedding
from kerple.positional.alibi import AlibiBias
from kerple.positional.base import PositionalEmbedding, PositionKind
from kerple.positional.gaussian import GaussBias2, GaussBias3, GaussWeight1, GaussWeight2
from kerple.positional.kerple import (
    KerpleBiasWeight,
    KerpleLog,
    KerpleLog3,
    KerplePower,
    KerplePowerOriginal,
    KerpleWeight,
)
from kerple.positional.rotary import RotaryEmbedding
from kerple.positional.sandwich import Sandwich, SmoothedSandwich
from kerple.positional.t5 import T5RelativeBias

_REGISTRY: dict[str, type[PositionalEmbedding]] = {
    "none": NoPositionalEmbedding,  # NoPE, thesis ch. 2
    "learned": LearnedPositionalEmbedding,  # docs/reference-format.md §3
    "sinusoidal": SinusoidalPositionalEmbedding,  # docs/reference-format.md §3
    "rotary": RotaryEmbedding,  # docs/reference-format.md §3
    "alibi": AlibiBias,  # docs/reference-format.md §3, thesis Table 4.1
    "rpe": T5RelativeBias,  # T5 bias, KERPLE paper §4
    "kerple_log": KerpleLog,  # KERPLE paper §4 logarithmic
    "kerple_power": KerplePower,  # KERPLE paper §4 power
    "kerple_log3": KerpleLog3,  # KERPLE paper §5.3 3-para-log
    "kerple_bias_wht": KerpleBiasWeight,  # KERPLE paper §5.3 bias+wht
    "kerple_wht": KerpleWeight,  # reference kerple_power__ap
    "kerple_power_original": KerplePowerOriginal,  # reference: ALiBi slopes via the power class
    "gauss_wht1": GaussWeight1,  # KERPLE Appendix A.3 1-para-wht
    "gauss_wht2": GaussWeight2,  # KERPLE Appendix A.3 2-para-wht
    "gauss_bias2": GaussBias2,  # KERPLE Appendix A.3 2-para-bias
    "gauss_bias3": GaussBias3,  # KERPLE Appendix A.3 3-para-bias
    "sandwich": Sandwich,  # thesis §4.6.1
    "sandwich_smoothed": SmoothedSandwich,  # thesis §4.6.2
}

_ALIASES: dict[str, str] = {
    "t5": "rpe",
    "kerple_power_ap_": "kerple_power",
    "kerple_power_ap_ap": "kerple_bias_wht",
    "kerple_power__ap": "kerple_wht",
}

OPTION_NAMES: frozenset[str] = frozenset(
    {
        "rotary_pct",
        "rotary_emb_base",
        "alibi_slope_shift",
        "alibi_equal_slope",
        "sandwich_dim",
        "rpe_num_buckets",
        "rpe_max_distance",
        "head_offset",
        "total_heads",
    }
)
"""Every option ``build`` understands; each family takes the subset its constructor names."""


def names() -> list[str]:
    """Canonical registry names, in registry order."""
    return list(_REGISTRY)


def aliases() -> dict[str, str]:
    """Alias -> canonical name (reference ``pos_emb`` strings and short forms)."""
    return dict(_ALIASES)


def canonical(name: str) -> str:
    """Resolve ``name`` (canonical, alias or reference string; case-insensitive) to its canonical name.

    Raises ``KeyError`` listing the valid names.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        valid = ", ".join(names())
        known_aliases = ", ".join(f"{alias} -> {target}" for alias, target in _ALIASES.items())
        raise KeyError(f"unknown positional embedding {name!r}; valid names: {valid} (aliases: {known_aliases})")
    return key


def family(name: str) -> type[PositionalEmbedding]:
    """The class implementing ``name`` (aliases accepted)."""
    return _REGISTRY[canonical(name)]


def build(
    name: str, *, num_heads: int, head_dim: int, hidden_size: int, max_positions: int, **options: Any
) -> PositionalEmbedding:
    """Build the embedding ``name`` with the options its family uses.

    Options outside :data:`OPTION_NAMES` raise ``TypeError`` (typos must not pass silently);
    known options the family does not use, and options set to ``None``, are ignored so callers can
    pass every option of the config (``cfg.positional.options()``) unconditionally.
    """
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        raise TypeError(f"unknown positional option(s) {unknown}; known: {sorted(OPTION_NAMES)}")
    cls = family(name)
    accepted = inspect.signature(cls.__init__).parameters
    used = {key: value for key, value in options.items() if key in accepted and value is not None}
    return cls(num_heads=num_heads, head_dim=head_dim, hidden_size=hidden_size, max_positions=max_positions, **used)


__all__ = [
    "OPTION_NAMES",
    "PositionKind",
    "PositionalEmbedding",
    "aliases",
    "build",
    "canonical",
    "family",
    "names",
]
