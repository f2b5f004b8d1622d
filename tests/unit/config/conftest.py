"""Fixtures for the config tests: YAML files in a temporary directory, and stand-ins for the
positional registry and the attention implementations so that these tests pin the config
system's own behaviour (the real modules are exercised in test_config_real_registry.py)."""

from __future__ import annotations

import textwrap
import types
from collections.abc import Callable
from pathlib import Path

import pytest

# name -> (kind, learnable), mirroring the reference's families
FAKE_FAMILIES = {
    "none": ("none", False),
    "learned": ("input", True),
    "sinusoidal": ("input", False),
    "rotary": ("query_key", False),
    "alibi": ("bias", False),
    "rpe": ("bias", True),
    "kerple_log": ("bias", True),
    "kerple_wht": ("weight", True),
}
FAKE_ALIASES = {"t5": "rpe", "kerple_power__ap": "kerple_wht"}
FAKE_REFUSAL = "fake kernel: no backward for bias tables"


class FakeAttention(types.ModuleType):
    """``kerple.model.attention`` stand-in: refuses flex training of bias embeddings."""

    refusal = FAKE_REFUSAL

    def __init__(self) -> None:
        super().__init__("kerple.model.attention")
        self.calls: list[tuple] = []

    def unsupported_reason(self, impl: str, kind: str, device_type: str, training: bool) -> str | None:
        self.calls.append((impl, kind, device_type, training))
        if impl == "flex" and kind == "bias" and training:
            return FAKE_REFUSAL
        return None


def _fake_positional() -> types.ModuleType:
    module = types.ModuleType("kerple.positional")

    def canonical(name: str) -> str:
        name = FAKE_ALIASES.get(name, name)
        if name not in FAKE_FAMILIES:
            raise KeyError(name)
        return name

    def family(name: str) -> types.SimpleNamespace:
        kind, learnable = FAKE_FAMILIES[canonical(name)]
        return types.SimpleNamespace(kind=kind, learnable=learnable, tensor_parallel=True)

    module.canonical = canonical
    module.family = family
    module.names = lambda: list(FAKE_FAMILIES)
    module.options_problem = lambda name, options, shape: None
    module.length_problem = lambda name, options, shape, length, dtype: None
    return module


@pytest.fixture
def fake_attention(monkeypatch: pytest.MonkeyPatch) -> FakeAttention:
    """Install the stand-in registry and attention check where validation reads them; returns the
    attention stand-in."""
    from kerple.config import messages, validate

    attention = FakeAttention()
    registry = _fake_positional()
    monkeypatch.setattr(validate, "positional_registry", registry)
    monkeypatch.setattr(messages, "positional_registry", registry)
    monkeypatch.setattr(validate, "unsupported_reason", attention.unsupported_reason)
    return attention


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], str]:
    """``write("a.yml", text)`` writes dedented ``text`` and returns the path as a string."""

    def _write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return str(path)

    return _write
