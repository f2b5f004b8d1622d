"""A positional option is declared once, beside its family; the registry, the config section and
the reference page derive from that declaration."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kerple.positional as positional
from kerple.config import ConfigError, PositionalConfig, load_config
from kerple.config.fields import describe_type
from kerple.config.neox_keys import FIELDS
from kerple.positional.alibi import AlibiOptions
from kerple.positional.rotary import RotaryOptions

REPO = Path(__file__).resolve().parents[3]

# The positional keys as the config section declared them by hand before the options moved
# beside their families: key -> (type, default, minimum, maximum).
SECTION_BEFORE = {
    "pos_emb": ("str", "learned", None, None),
    "rotary_pct": ("float", 1.0, 0.0, 1.0),
    "rotary_emb_base": ("float", 10000.0, 1.0, None),
    "alibi_slope_shift": ("float", 0.0, None, None),
    "alibi_equal_slope": ("int or null", None, None, None),
    "sandwich_dim": ("int", 128, 2, None),
    "rpe_num_buckets": ("int", 32, 2, None),
    "rpe_max_distance": ("int", 128, 1, None),
}
# Declared later, with the families that came after KERPLE (fire.py, xpos.py) and RoPE context extension.
ADDED_SINCE = {
    "rope_scaling": ("mapping or null", None, None, None),
    "fire_mlp_width": ("int", 32, 1, None),
    "fire_init_c": ("float", 0.1, 1e-6, None),
    "fire_init_threshold": ("float", 512.0, 1.0, None),
    "xpos_scale_base": ("float", 512.0, 1.0, None),
    "xpos_gamma": ("float", 0.4, None, None),
}


def test_section_keys_types_defaults_and_bounds_are_unchanged() -> None:
    refs = [ref for ref in FIELDS if ref.section == "positional"]
    declared = {
        ref.primary: (describe_type(ref.hint), getattr(PositionalConfig(), ref.name), ref.metadata["minimum"],
                      ref.metadata["maximum"])
        for ref in refs
    }
    assert declared == {**SECTION_BEFORE, **ADDED_SINCE}


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("sandwich_dim: 127\n", "must be even, got 127"),
        ("sandwich_dim: 0\n", "must be >= 2"),
        ("rotary_pct: 1.5\n", "must be <= 1.0"),
        ("rotary_emb_base: 0.5\n", "must be >= 1.0"),
        ("alibi_equal_slope: 2.5\n", "expected int or null"),
        ("rpe_num_buckets: 1\n", "must be >= 2"),
        ("rpe_max_distance: true\n", "expected int"),
        ("xpos_gamma: 0\n", "must be > 0"),
        ("fire_mlp_width: 0\n", "must be >= 1"),
    ],
)
def test_checks_name_the_file_and_key(tmp_path: Path, text: str, detail: str) -> None:
    path = tmp_path / "pe.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config([str(path)])
    key = text.split(":")[0]
    assert str(path) in str(info.value) and f"key '{key}'" in str(info.value) and detail in str(info.value)


def test_option_names_are_the_section_fields_and_options() -> None:
    names = positional.option_names()
    assert set(names) == set(SECTION_BEFORE) - {"pos_emb"} | set(ADDED_SINCE)
    assert [f.name for f in dataclasses.fields(PositionalConfig)] == ["pos_emb", *names]
    assert tuple(PositionalConfig().options()) == names
    assert "head_offset" not in names and "total_heads" not in names  # tensor-parallel arguments, not options


def test_build_hands_each_family_its_options_object() -> None:
    sizes = dict(num_heads=4, head_dim=8, hidden_size=32, max_positions=16)
    cfg = load_config([], {"pos_emb": "rotary", "rotary_pct": 0.5, "alibi_equal_slope": 3})
    rotary = positional.build(cfg.positional.pos_emb, **sizes, **cfg.positional.options())
    assert rotary.rotary_ndims == 4 and rotary.base == RotaryOptions().rotary_emb_base
    alibi = positional.build("alibi", **sizes, alibi_equal_slope=3, head_offset=2, total_heads=8)
    assert alibi.slopes.tolist() == [2.0**-3] * 4
    assert AlibiOptions().alibi_equal_slope is None


def test_two_families_cannot_declare_the_same_option(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(frozen=True)
    class Clash:
        rotary_pct: float = positional.options.option(0.5, "Clashes with rotary.")

    class ClashingFamily(positional.PositionalEmbedding):
        options_class = Clash

    monkeypatch.setitem(positional._REGISTRY, "clash", ClashingFamily)
    with pytest.raises(RuntimeError, match="'rotary_pct' is declared by RotaryOptions and Clash"):
        positional.option_specs()


# A new family with two new options, declared in one place, registered with one registry line;
# then the config section, the checks, build() and the reference page are asked about them.
NEW_FAMILY = textwrap.dedent(
    """
    from dataclasses import dataclass

    import kerple.positional as positional
    from kerple.positional.base import PositionalEmbedding, PositionKind
    from kerple.positional.options import must_be_even, option

    @dataclass(frozen=True)
    class ToyOptions:
        toy_gain: float = option(2.0, "Gain of the toy bias.", minimum=0.5, maximum=4.0)
        toy_width: int = option(4, "Width of the toy bias; even.", minimum=2, check=must_be_even)

    class ToyBias(PositionalEmbedding):
        kind = PositionKind.BIAS
        options_class = ToyOptions

        def __init__(self, shape, options=ToyOptions()):
            super().__init__(shape)
            self.options = options

    positional._REGISTRY["toy"] = ToyBias

    from kerple.config import ConfigError, PositionalConfig, load_config
    from kerple.config.reference import render_reference

    assert positional.option_names()[-2:] == ("toy_gain", "toy_width")
    cfg = load_config([], {"pos_emb": "toy", "toy-gain": 3})
    assert (cfg.positional.toy_gain, cfg.positional.options()["toy_width"]) == (3.0, 4)
    assert cfg.to_dict()["toy_gain"] == 3.0 and PositionalConfig().toy_width == 4
    built = positional.build("toy", num_heads=2, head_dim=4, hidden_size=8, max_positions=8, **cfg.positional.options())
    assert built.options == ToyOptions(toy_gain=3.0, toy_width=4)
    for overrides, detail in [({"toy_gain": 5}, "key 'toy_gain': invalid value: must be <= 4.0, got 5"),
                              ({"toy_width": 3}, "key 'toy_width': must be even, got 3"),
                              ({"toy_width": 2.5}, "key 'toy_width': wrong type: expected int")]:
        try:
            load_config([], overrides)
        except ConfigError as error:
            assert detail in str(error), str(error)
        else:
            raise AssertionError(f"{overrides} loaded")
    page = render_reference()
    assert "| `toy_gain` | float | `2.0` | `toy-gain` | Gain of the toy bias. |" in page
    assert "| `toy_width` | int | `4` | `toy-width` | Width of the toy bias; even. |" in page
    print("toy options derived")
    """
)


def test_a_new_option_appears_in_every_derived_place() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", NEW_FAMILY], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "toy options derived"


@pytest.mark.parametrize("name", ["fire", "cable"])
def test_tensor_parallelism_is_refused_for_terms_shared_by_all_heads(tmp_path: Path, name: str) -> None:
    path = tmp_path / "pe.yml"
    path.write_text(f"pos_emb: {name}\nmodel_parallel_size: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config([str(REPO / "configs/models/tiny.yml"), str(path)])
    message = str(info.value)
    assert "keys 'pos_emb' and 'model_parallel_size'" in message and "set model_parallel_size: 1" in message
    load_config([str(REPO / "configs/models/tiny.yml")], {"pos_emb": "kerple_log", "model_parallel_size": 2})
