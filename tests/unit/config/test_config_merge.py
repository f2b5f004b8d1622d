"""Merge order, dash/underscore equivalence, override logging and YAML typing."""

from __future__ import annotations

import logging

import pytest

from kerple.config import ConfigError, load_config, parse_overrides

pytestmark = pytest.mark.usefixtures("fake_attention")


def _override_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kerple.config"]


def test_later_dashed_file_overrides_earlier_underscored(write, caplog):
    a = write("a.yml", "hidden_size: 768\nnum_attention_heads: 16\n")
    b = write("b.yml", "hidden-size: 1024\n")
    with caplog.at_level(logging.INFO, logger="kerple.config"):
        cfg = load_config([a, b])
    assert cfg.model.hidden_size == 1024
    assert cfg.model.head_dim == 64  # 1024 / 16, from the merged values
    messages = _override_messages(caplog)
    assert len(messages) == 1
    assert messages[0] == f"hidden_size: 768 ({a}) -> 1024 ({b})"


def test_later_underscored_file_overrides_earlier_dashed(write, caplog):
    a = write("a.yml", "seq-length: 512\n")
    b = write("b.yml", "seq_length: 2048\n")
    with caplog.at_level(logging.INFO, logger="kerple.config"):
        cfg = load_config([a, b])
    assert cfg.model.seq_length == 2048
    assert _override_messages(caplog) == [f"seq_length: 512 ({a}) -> 2048 ({b})"]


def test_three_files_in_order_then_command_line(write, caplog):
    a = write("a.yml", "num-layers: 2\ntrain-iters: 10\n")
    b = write("b.yml", "num_layers: 4\n")
    c = write("c.yml", "num-layers: 6\n")
    with caplog.at_level(logging.INFO, logger="kerple.config"):
        cfg = load_config([a, b, c], {"num-layers": 8})
    assert cfg.model.num_layers == 8
    assert cfg.training.train_iters == 10  # set once, never overridden
    assert _override_messages(caplog) == [
        f"num_layers: 2 ({a}) -> 4 ({b})",
        f"num_layers: 4 ({b}) -> 6 ({c})",
        f"num_layers: 6 ({c}) -> 8 (<command line>)",
    ]
    assert cfg.source("num-layers") == "<command line>"
    assert cfg.source("train_iters") == a
    assert cfg.source("seed") == "<default>"


def test_same_key_twice_in_one_file_is_an_error(write):
    path = write("dup.yml", "hidden-size: 768\nhidden_size: 1024\n")
    with pytest.raises(ConfigError) as info:
        load_config([path])
    message = str(info.value)
    assert path in message and "hidden_size" in message and "hidden-size" in message


def test_exact_duplicate_yaml_key_is_an_error(write):
    path = write("dup.yml", "seed: 1\nnum_layers: 2\nseed: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config([path])
    assert path in str(info.value) and "'seed'" in str(info.value) and "lines 1 and 3" in str(info.value)


def test_flat_key_and_block_key_for_one_field_in_one_file_is_an_error(write):
    path = write(
        "wd.yml",
        """\
        weight-decay: 0.1
        optimizer:
          type: Adam
          params: {lr: 0.001, weight_decay: 0.0}
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config([path])
    assert path in str(info.value) and "weight" in str(info.value)


def test_flat_and_block_spellings_merge_across_files(write, caplog):
    a = write("a.yml", "optimizer: {type: Adam, params: {lr: 0.0006, weight_decay: 0.0}}\n")
    b = write("b.yml", "weight-decay: 0.1\nlr: 0.0002\n")
    with caplog.at_level(logging.INFO, logger="kerple.config"):
        cfg = load_config([a, b])
    assert cfg.optimizer.weight_decay == 0.1
    assert cfg.optimizer.lr == 0.0002
    assert len(_override_messages(caplog)) == 2


def test_blocks_merge_key_by_key(write):
    a = write(
        "a.yml",
        "fp16: {enabled: true, loss_scale_window: 500, hysteresis: 3}\n"
        "zero_optimization: {stage: 1, overlap_comm: true}\n",
    )
    b = write("b.yml", "fp16: {enabled: false}\nzero_optimization: {stage: 2}\n")
    cfg = load_config([a, b])
    assert cfg.precision.precision == "fp32"
    assert cfg.precision.loss_scale_window == 500
    assert cfg.precision.hysteresis == 3
    assert cfg.parallelism.zero_optimization == {"stage": 2, "overlap_comm": True}
    assert cfg.parallelism.zero_stage == 2


def test_parse_overrides_types_values_as_yaml_scalars():
    parsed = parse_overrides(
        [
            "seq-length=1024",
            "pos_emb=t5",
            "lr=1e-4",
            "use_wandb=true",
            "optimizer.params.betas=[0.9, 0.95]",
            "split=949,50,1",
            "attention_window=",
            "wandb_group=2023-01-01",
        ]
    )
    assert parsed == {
        "seq-length": 1024,
        "pos_emb": "t5",
        "lr": 0.0001,
        "use_wandb": True,
        "optimizer.params.betas": [0.9, 0.95],
        "split": "949,50,1",
        "attention_window": None,
        "wandb_group": "2023-01-01",
    }
    assert isinstance(parsed["lr"], float) and isinstance(parsed["seq-length"], int)


def test_overrides_are_applied_after_files(write):
    a = write("a.yml", "seq-length: 512\npos-emb: alibi\nfp16: {enabled: true}\n")
    cfg = load_config([a], parse_overrides(["seq_length=1024", "pos-emb=t5", "fp16.enabled=false", "lr=1e-4"]))
    assert cfg.model.seq_length == 1024
    assert cfg.positional.pos_emb == "rpe"  # alias resolved to the canonical name
    assert cfg.precision.precision == "fp32"
    assert cfg.optimizer.lr == pytest.approx(1e-4)


def test_override_key_given_twice_is_an_error():
    with pytest.raises(ConfigError) as info:
        parse_overrides(["seq-length=1", "seq_length=2"])
    assert "<command line>" in str(info.value) and "seq_length" in str(info.value)


def test_exponent_without_dot_is_a_float_and_dates_stay_strings(write):
    path = write("t.yml", "optimizer: {params: {eps: 1e-8, lr: 3e-4}}\nwandb_group: 2023-01-01\n")
    cfg = load_config([path])
    assert cfg.optimizer.eps == 1e-8 and isinstance(cfg.optimizer.eps, float)
    assert cfg.optimizer.lr == 3e-4
    assert cfg.logging.wandb_group == "2023-01-01"


def test_json_style_reference_file_with_trailing_commas_and_comments(write):
    path = write(
        "neox.yml",
        """\
        # GPT-NeoX configs are JSON-like YAML
        {
          "num-layers": 2,
          "hidden-size": 64,
          "num-attention-heads": 4,
          "partition-activations": true,
          "zero_allow_untested_optimizer": True,
        }
        """,
    )
    cfg = load_config([path])
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.head_dim) == (2, 64, 16)
    assert cfg.training.partition_activations is True  # kept although it has no effect
    assert cfg.parallelism.zero_allow_untested_optimizer is True


def test_empty_file_gives_defaults(write):
    cfg = load_config([write("empty.yml", "")])
    assert cfg.model.num_layers == 12 and cfg.positional.pos_emb == "learned"
