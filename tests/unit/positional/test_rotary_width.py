"""A rotary width that cannot be rotated in pairs is refused when the config loads, naming the fix
(it used to trace back when the model was built)."""

from __future__ import annotations

import re

import pytest

from kerple.config import ConfigError, load_config


@pytest.mark.parametrize("pos_emb", ["rotary", "xpos"])
@pytest.mark.parametrize(("hidden", "heads", "pct"), [(100, 4, 1.0), (12, 4, 1.0), (128, 4, 0.01), (100, 4, 0.3)])
def test_an_odd_or_empty_rotary_width_is_refused_with_a_fix_that_loads(pos_emb, hidden, heads, pct) -> None:
    keys = {"pos_emb": pos_emb, "hidden_size": hidden, "num_attention_heads": heads, "rotary_pct": pct}
    head_dim = hidden // heads
    width = int(head_dim * pct)
    with pytest.raises(ConfigError) as refused:
        load_config([], keys)
    message = str(refused.value)
    assert refused.value.key == "rotary_pct" and "\n" not in message
    assert f"int({head_dim} x {pct}) = {width} channels" in message and "even number, at least 2" in message
    for suggested in re.findall(r"(?:e\.g\. |at least )([0-9.]+)", message.split("at least 2")[1]):
        cfg = load_config([], {**keys, "rotary_pct": float(suggested)})  # the suggested value is accepted
        assert int(head_dim * cfg.positional.rotary_pct) % 2 == 0
    if head_dim % 2:
        assert "hidden_size / num_attention_heads even" in message


def test_an_even_width_is_accepted() -> None:
    cfg = load_config([], {"pos_emb": "rotary", "hidden_size": 100, "num_attention_heads": 4, "rotary_pct": 0.96})
    assert int(cfg.model.head_dim * cfg.positional.rotary_pct) == 24
