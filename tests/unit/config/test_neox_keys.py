"""GPT-NeoX keys one by one: features kerple lacks are refused in one line while off loads;
attention_config with "all" and flash; query-key layer scaling; schedule and checkpoint keys."""

from __future__ import annotations

import pytest

from kerple.config import ConfigError, load_config
from kerple.errors import entry_point

pytestmark = pytest.mark.usefixtures("fake_attention")


def refused(write, text: str) -> str:
    path = write("f.yml", text)
    with pytest.raises(ConfigError) as info:
        load_config([path])
    message = str(info.value)
    assert path in message and "\n" not in message
    return message


@pytest.mark.parametrize(
    ("text", "feature"),
    [
        ("moe_num_experts: 8\n", "mixture of experts"),
        ("use_bnb_optimizer: true\n", "bitsandbytes"),
        ("te_mha: true\n", "Transformer Engine"),
        ("use_qk_layernorm: true\n", "LayerNorm on queries and keys"),
        ("use_bias_in_mlp: false\n", "without biases"),
        ("train_impl: dpo\n", "preference and reward training"),
        ("z_loss: 0.0001\n", "z-loss"),
        ("exit_interval: 100\n", "exit_interval"),
        ("num_kv_heads: 4\n", "grouped-query attention"),
        ("intermediate_size: 1000\n", "MLP width of 1000"),
        ("expansion_factor: 2.5\n", "MLP width"),
        ("mlp_multiple_of: 256\nhidden_size: 96\nnum_attention_heads: 12\n", "4 x hidden_size = 384 up to 512"),
        ("num_unique_layers: 6\n", "layer sharing"),
        ("gpt_j_residual: true\ngpt_j_tied: true\n", "gpt_j_tied"),
        ("soft_prompt_tuning: {enabled: true, n_tokens: 10}\n", "soft-prompt"),
        ("activation: swiglu\n", "gated activation swiglu"),
        ("norm: te_rmsnorm\n", "Transformer Engine"),
        ("tokenizer_type: TiktokenTokenizer\n", "tiktoken"),
        ("attention_config: [[[local, global], 6]]\n", "['local']"),
        ("attention_config: [[[mamba], all]]\n", "['mamba']"),
    ],
)
def test_missing_features_are_refused_in_one_line(write, text, feature):
    assert feature in refused(write, text)


@pytest.mark.parametrize(
    "text",
    [
        "moe_num_experts: 1\nmoe_top_k: 2\n",  # one expert is an ordinary MLP; its settings are inert
        "use_bias_in_mlp: true\nte_fp8_format: e4m3\n",
        "num_kv_heads: 12\nintermediate_size: 3072\nmlp_multiple_of: 256\n",  # 12 heads, 4 x 768
        "expansion_factor: 4\n",
        "gpt_j_tied: true\n",  # without the parallel residual it changes nothing
        "soft_prompt_tuning: {enabled: false}\n",
        "train_impl: normal\ndpo_beta: 0.5\n",
        "num_unique_layers: 12\n",
    ],
)
def test_the_same_keys_load_while_the_feature_is_off(write, text):
    load_config([write("ok.yml", text)])


def test_silu_is_swish(write):
    assert load_config([write("a.yml", "activation: silu\n")]).model.activation == "swish"


@pytest.mark.parametrize(
    "layers",
    ["[[[global], all]]", "[[[flash], all]]", "[[[global, flash], all]]", "[[[flash], 12]]",
     "[[[global], 4], [[flash], 8]]"],
)
def test_attention_config_global_flash_and_all(write, layers):
    cfg = load_config([write("a.yml", f"num_layers: 12\nattention_config: {layers}\n")])
    assert cfg.attention.attention_config is not None


def test_attention_config_counts(write):
    assert "covers 11 layers" in refused(write, "num_layers: 12\nattention_config: [[[global], 11]]\n")
    pattern = "[[[global, flash, flash, flash, global], all]]"
    assert "does not divide" in refused(write, f"num_layers: 12\nattention_config: {pattern}\n")
    assert "layer_count" in refused(write, "attention_config: [[[global], twelve]]\n")


@pytest.mark.parametrize("pos_emb", ["rotary", "learned", "sinusoidal", "none"])
def test_layer_scaling_is_accepted_where_it_changes_nothing(write, pos_emb):
    cfg = load_config([write("s.yml", f"pos_emb: {pos_emb}\napply_query_key_layer_scaling: true\n")])
    assert cfg.model.apply_query_key_layer_scaling is True


@pytest.mark.parametrize("pos_emb", ["alibi", "kerple_log", "rpe", "kerple_wht"])
def test_layer_scaling_is_refused_where_it_scales_the_positional_term(write, pos_emb):
    message = refused(write, f"pos_emb: {pos_emb}\napply_query_key_layer_scaling: true\n")
    assert "max(1, i)" in message and "apply_query_key_layer_scaling" in message


def test_checkpoint_factor_is_the_save_interval(write):
    assert load_config([write("c.yml", "checkpoint_factor: 250\n")]).checkpointing.save_interval == 250
    logged = load_config([write("l.yml", "checkpoint_factor: 10\ncheckpoint_scale: log\n")])
    assert logged.checkpointing.save_interval == 1000  # kerple saves linearly; the note says so
    assert "both set the save interval" in refused(write, "checkpoint_factor: 250\nsave_interval: 500\n")
    assert "whole number" in refused(write, "checkpoint_factor: 2.5\n")


def test_lr_decay_fraction_and_the_resume_options(write):
    cfg = load_config([write("f.yml", "train_iters: 1000\nlr_decay_fraction: 0.75\n")])
    assert cfg.lr_schedule.lr_decay_iters == 750
    explicit = load_config([write("e.yml", "train_iters: 1000\nlr_decay_fraction: 0.75\nlr_decay_iters: 900\n")])
    assert explicit.lr_schedule.lr_decay_iters == 900
    defaults = load_config([]).lr_schedule
    assert (defaults.use_checkpoint_lr_scheduler, defaults.override_lr_scheduler) == (False, False)
    assert load_config([write("x.yml", "lr_decay_style: exponential\n")]).lr_schedule.lr_decay_style == "exponential"
    message = refused(write, "use_checkpoint_lr_scheduler: true\noverride_lr_scheduler: true\n")
    assert "use_checkpoint_lr_scheduler" in message and "override_lr_scheduler" in message


def test_no_effect_keys_at_their_default_are_not_saved(write, tmp_path):
    cfg = load_config([write("n.yml", "rope_fusion: false\nlayernorm_fusion: true\ncomment: neox\n")])
    saved = cfg.to_dict()
    assert "rope_fusion" not in saved and saved["layernorm_fusion"] is True and saved["comment"] == "neox"
    cfg.save_yaml(tmp_path / "r.yml")
    assert load_config([tmp_path / "r.yml"]) == cfg


def test_entry_points_print_the_note(write, capsys, monkeypatch):
    @entry_point("prog")
    def cli_load(paths: list[str]) -> int:
        load_config(paths)
        return 0

    monkeypatch.delenv("RANK", raising=False)
    cli_load([write("p.yml", "rope_fusion: true\nmaster_port: 6000\n")])
    err = capsys.readouterr().err
    assert "GPT-NeoX keys accepted without effect in kerple (2)" in err
    assert "master_port = 6000" in err and "deepy.py --master_port" in err
    monkeypatch.setenv("RANK", "1")
    cli_load([write("q.yml", "rope_fusion: true\n")])
    assert capsys.readouterr().err == ""


def test_a_data_path_that_separate_paths_override_is_said(write, capsys, monkeypatch):
    """data_path over a data config naming train_data_paths trained on the latter without a word."""
    @entry_point("prog")
    def cli_load(paths: list[str], overrides: dict | None = None) -> int:
        load_config(paths, overrides)
        return 0

    monkeypatch.delenv("RANK", raising=False)
    separate = write("data.yml", "train-data-paths: [data/a/a_train]\nvalid-data-paths: [data/a/a_valid]\n")
    mine = write("mine.yml", "data-path: data/mine/mine_text_document\n")
    cli_load([separate, mine])
    assert (f"warning: data_path data/mine/mine_text_document ({mine}) is not used: train_data_paths "
            f"['data/a/a_train'] ({separate}) take precedence") in capsys.readouterr().err
    cli_load([separate, mine], {"train_data_paths": None, "valid_data_paths": None})
    cli_load([separate])
    assert "warning" not in capsys.readouterr().err
