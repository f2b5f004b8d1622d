"""Registry: names, aliases (reference pos_emb strings), errors, option routing."""

from __future__ import annotations

import pytest
import torch

import kerple.positional as positional
from kerple.positional.base import PositionalEmbedding

REQUIRED_NAMES = {
    "none",
    "learned",
    "sinusoidal",
    "rotary",
    "alibi",
    "rpe",
    "kerple_log",
    "kerple_power",
    "kerple_log3",
    "kerple_bias_wht",
    "kerple_wht",
    "kerple_power_original",
    "gauss_wht1",
    "gauss_wht2",
    "gauss_bias2",
    "gauss_bias3",
    "sandwich",
    "sandwich_smoothed",
    "fire",
    "cable",
    "xpos",
}

# docs/reference-format.md §1: every pos_emb string of the reference, plus short aliases.
REFERENCE_STRINGS = {
    "learned": "learned",
    "rotary": "rotary",
    "sinusoidal": "sinusoidal",
    "rpe": "rpe",
    "alibi": "alibi",
    "none": "none",
    "kerple_log": "kerple_log",
    "kerple_power_ap_": "kerple_power",
    "kerple_power__ap": "kerple_wht",
    "kerple_power_ap_ap": "kerple_bias_wht",
    "kerple_power_original": "kerple_power_original",
    "t5": "rpe",
}

SIZES = dict(num_heads=4, head_dim=8, hidden_size=32, max_positions=64)


def test_names_are_exactly_the_required_set() -> None:
    assert set(positional.names()) == REQUIRED_NAMES
    assert len(positional.names()) == len(REQUIRED_NAMES)


@pytest.mark.parametrize("alias,expected", sorted(REFERENCE_STRINGS.items()))
def test_reference_strings_resolve(alias: str, expected: str) -> None:
    assert positional.canonical(alias) == expected
    assert positional.canonical(alias.upper()) == expected
    assert issubclass(positional.family(alias), PositionalEmbedding)


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(KeyError) as info:
        positional.canonical("kerple_logg")
    message = str(info.value)
    for name in REQUIRED_NAMES:
        assert name in message
    with pytest.raises(KeyError):
        positional.build("nope_not_here", **SIZES)


def test_unknown_option_is_refused_but_unused_ones_are_ignored() -> None:
    with pytest.raises(TypeError, match="rotary_pc"):
        positional.build("rotary", rotary_pc=0.5, **SIZES)
    # Options of other families and None values are ignored.
    module = positional.build(
        "kerple_log", rotary_pct=0.25, alibi_equal_slope=None, sandwich_dim=64, rpe_num_buckets=16, **SIZES
    )
    assert module.num_heads == 4


def test_options_reach_their_family() -> None:
    rotary = positional.build("rotary", rotary_pct=0.5, rotary_emb_base=500.0, **SIZES)
    assert rotary.rotary_ndims == 4
    assert torch.allclose(rotary.inv_freq, torch.tensor([1.0, 500.0**-0.5]))
    t5 = positional.build("t5", rpe_num_buckets=16, rpe_max_distance=64, **SIZES)
    assert tuple(t5.weight.shape) == (16, 4)
    sandwich = positional.build("sandwich", sandwich_dim=64, **SIZES)
    assert sandwich.sandwich_dim == 64
    alibi = positional.build("alibi", alibi_equal_slope=3, **SIZES)
    assert torch.equal(alibi.slopes, torch.full((4,), 2.0**-3))


def test_every_family_builds_through_an_alias_and_its_canonical_name() -> None:
    for name in positional.names():
        assert type(positional.build(name, **SIZES)) is positional.family(name)


@pytest.mark.parametrize("name", positional.names())
def test_every_family_is_built_from_one_shape(name: str) -> None:
    """``build`` hands each family one ``ModelShape`` (the tensor-parallel slice and the layer count
    included) and its options object, nothing read from the constructor's signature."""
    shape = positional.ModelShape(**SIZES, num_layers=3, head_offset=4, total_heads=8)
    module = positional.build(name, **SIZES, num_layers=3, head_offset=4, total_heads=8)
    assert module.shape == shape
    cls = positional.family(name)
    direct = cls(shape) if cls.options_class is None else cls(shape, cls.options_class())
    assert sorted(direct.state_dict()) == sorted(module.state_dict())
    assert [tuple(t.shape) for t in direct.state_dict().values()] == [tuple(t.shape) for t in module.state_dict().values()]
