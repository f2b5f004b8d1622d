"""docs/config.md is generated from the dataclasses and must be current."""

from __future__ import annotations

from pathlib import Path

from kerple.config.reference import render_reference

PAGE = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def test_docs_page_is_current():
    assert PAGE.exists(), "docs/config.md is missing: run `make docs`"
    assert PAGE.read_text(encoding="utf-8") == render_reference(), (
        "docs/config.md is out of date with kerple/config/sections.py or the positional options: run `make docs` "
        "(tools/gen_config_docs.py) and commit the result"
    )


def test_docs_page_lists_keys_aliases_and_no_effect_keys():
    page = render_reference()
    assert "| `hidden_size` | int | `768` | `hidden-size` |" in page
    assert "`train_micro_batch_size_per_gpu`" in page and "`optimizer.params.lr`" in page
    no_effect = page.split("## Accepted for compatibility, no effect", 1)[1]
    for key in ("partition_activations", "scaled_upper_triang_masked_softmax_fusion", "launcher", "data_impl"):
        assert f"- `{key}`" in no_effect
    assert "- `hidden_size`" not in no_effect
