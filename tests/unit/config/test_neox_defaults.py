"""Every key of GPT-NeoX's argument definitions loads in kerple, and a key a config leaves out takes
the KERPLE fork's default: checked against the table in neox_defaults.yml (facts read from the
fork's and GPT-NeoX's ``neox_args.py``; see its header), not against kerple's own code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kerple.config import load_config
from kerple.config.neox_keys import BLOCK_PATHS, DERIVED_KEYS, KEY_INDEX, field_default

TABLE = yaml.safe_load(Path(__file__).with_name("neox_defaults.yml").read_text(encoding="utf-8"))
DEFAULTS: dict[str, dict] = TABLE["defaults"]

DIFFERENT_ON_PURPOSE = {
    "num_layers": "required by GPT-NeoX (no default); kerple's default model is the paper's 162M",
    "hidden_size": "required by GPT-NeoX (no default); kerple's default model is the paper's 162M",
    "num_attention_heads": "required by GPT-NeoX (no default); kerple's default model is the paper's 162M",
    "seq_length": "required by GPT-NeoX in practice (no default); kerple's default model is the paper's 162M",
    "train_iters": "required by GPT-NeoX to train (no default); the paper's 50k steps",
    "log_interval": "null in the fork, where the training loop then fails; GPT-NeoX today defaults to 100, as kerple does",
    "save_interval": "no default in the fork, which requires it with 'save'; kerple saves every 1000 steps",
    "use_wandb": "null in the fork means 'on when a W&B key is found'; kerple logs to W&B only when asked",
    "git_hash": "computed by the GPT-NeoX launcher",
    "gradient_accumulation_steps": "1 in the fork; null in kerple derives it from the batch sizes, which gives 1 whenever "
    "the fork accepts the batch",
    "lr": "the fork copies optimizer.params.lr (default 0.001) into lr; kerple's lr is that same key",
    "clip_grad": "the fork copies gradient_clipping into clip_grad; kerple's clip_grad is that same key",
}
NOT_SETTABLE = {
    "padded_vocab_size": "derived from vocab_size in both",
    "zero_stage": "derived from zero_optimization.stage in both",
    "world_size": "derived from the launcher in both",
}


def same(kerple_default, reference_default) -> bool:
    if reference_default is None and kerple_default == {}:
        return True  # an absent DeepSpeed block or dict setting
    if isinstance(reference_default, (int, float)) and not isinstance(reference_default, bool):
        return isinstance(kerple_default, (int, float)) and float(kerple_default) == float(reference_default)
    return kerple_default == reference_default


def kerple_default(key: str):
    return field_default(KEY_INDEX[key])


def test_the_table_has_the_three_sources_and_their_key_counts():
    assert set(TABLE["sources"]) == {"kerple_fork", "neox_2022", "neox_current"}
    counts = {source: sum(source in row for row in DEFAULTS.values()) for source in TABLE["sources"]}
    assert counts["kerple_fork"] == counts["neox_2022"] + 1  # the fork adds seq_length_val
    assert counts["neox_current"] > 300


@pytest.mark.parametrize("source", ["kerple_fork", "neox_current"])
def test_every_reference_key_is_known(source):
    unknown = [
        key for key, row in DEFAULTS.items()
        if source in row and key not in KEY_INDEX and key not in BLOCK_PATHS and key not in DERIVED_KEYS
    ]
    assert unknown == []
    assert sorted(key for key, row in DEFAULTS.items() if source in row and key in DERIVED_KEYS) == sorted(NOT_SETTABLE)


def test_defaults_are_the_forks_except_where_documented():
    differing = {}
    for key, row in DEFAULTS.items():
        if "kerple_fork" not in row or key in NOT_SETTABLE or key in BLOCK_PATHS:
            continue
        if not same(kerple_default(key), row["kerple_fork"]):
            differing[key] = (kerple_default(key), row["kerple_fork"])
    assert sorted(differing) == sorted(DIFFERENT_ON_PURPOSE), differing


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hidden_dropout", 0.1),
        ("attention_dropout", 0.1),
        ("weight_decay", 0.01),
        ("gradient_clipping", 0.0),
        ("lr_decay_style", "linear"),
        ("no_weight_tying", False),
        ("split", "969, 30, 1"),
        ("eval_iters", 100),
        ("optimizer.params.lr", 0.001),
    ],
)
def test_the_measured_differences_now_follow_the_fork(key, value):
    assert DEFAULTS[key]["kerple_fork"] == value
    cfg = load_config([])
    ref = KEY_INDEX[key]
    assert getattr(getattr(cfg, ref.section), ref.name) == value


def test_an_omitted_block_means_deepspeeds_defaults():
    cfg = load_config([])
    assert cfg.precision.precision == "fp32" and cfg.parallelism.zero_optimization == {}
    assert DEFAULTS["fp16"]["kerple_fork"] is None and DEFAULTS["zero_optimization"]["kerple_fork"] is None
