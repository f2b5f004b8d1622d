"""Every model family behind one registry: one line per ``model.arch``.

Adding a family means one file (its decoder and its ``FAMILY``, see :mod:`kerple.model.family`)
and one line in ``_FAMILIES``; everything else asks the family's capabilities.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from kerple.model import gpt, regular
from kerple.model.family import ModelFamily

_FAMILIES: dict[str, ModelFamily] = {
    family.name: family
    for family in (
        gpt.FAMILY,  # the GPT-NeoX decoder, docs/reference-format.md §3-4
        regular.FAMILY,  # RegularGPT, thesis ch. 6
    )
}


def names() -> tuple[str, ...]:
    """The ``model.arch`` values, in registry order."""
    return tuple(_FAMILIES)


def family(name: str) -> ModelFamily:
    """The family ``name``; ``KeyError`` naming the known ones."""
    if name not in _FAMILIES:
        raise KeyError(f"unknown model.arch {name!r}; choose one of {', '.join(_FAMILIES)}")
    return _FAMILIES[name]


def unknown_family(name: str) -> str | None:
    """What is wrong with ``model.arch: name`` (``None`` when it names a family); for config checks."""
    return None if name in _FAMILIES else f"unknown model family; choose one of {', '.join(_FAMILIES)}"


def family_of(cfg: Any) -> ModelFamily:
    """The family of a :class:`kerple.config.Config` (``cfg.model.arch``)."""
    return family(cfg.model.arch)


def build_model(cfg: Any, *, flex_compile: bool = True) -> nn.Module:
    """The decoder of ``cfg``: its family's ``build``. ``flex_compile=False`` runs FlexAttention
    unfused (tests, or one-off forwards where compilation would cost more than it saves)."""
    return family_of(cfg).build(cfg, flex_compile=flex_compile)
