"""Every ConfigError names the file and the key, and says what would fix it."""

from __future__ import annotations

import pytest

from kerple.config import ConfigError, load_config, parse_overrides, split_arguments

pytestmark = pytest.mark.usefixtures("fake_attention")


def _error(paths, overrides=None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(paths, overrides)
    return info.value


@pytest.mark.parametrize("typo", ["hiden_size", "hiden-size"])
def test_unknown_key_suggests_the_closest(write, typo):
    path = write("typo.yml", f"{typo}: 768\n")
    error = _error([path])
    assert error.file == path and error.key == typo
    assert str(error).startswith(f"{path}: key '{typo}': unknown key")
    assert "did you mean 'hidden_size'?" in str(error)


def test_unknown_key_inside_a_block_suggests_within_the_block(write):
    path = write("opt.yml", "optimizer:\n  type: Adam\n  params: {lrr: 0.1}\n")
    error = _error([path])
    assert error.key == "optimizer.params.lrr"
    assert "did you mean 'optimizer.params.lr'?" in str(error) and path in str(error)


def test_block_key_written_at_top_level_points_to_its_block(write):
    error = _error([write("ls.yml", "initial_scale_power: 12\n")])
    assert "'fp16.initial_scale_power'" in str(error)


def test_unknown_key_from_the_command_line(write):
    error = _error([write("ok.yml", "seed: 1\n")], {"sed": 2})
    assert error.file == "<command line>" and "did you mean 'seed'?" in str(error)


def test_wrong_type_says_expected_and_got(write):
    path = write("t.yml", "num-layers: twelve\n")
    error = _error([path])
    assert error.file == path and error.key == "num-layers"
    assert "expected int, got str ('twelve')" in str(error)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("num_layers: 12.5\n", "expected int, got float"),
        ("num_layers: true\n", "expected int, got bool"),
        ("use_wandb: 1\n", "expected bool, got int"),
        ("optimizer: {params: {betas: [0.9, fast]}}\n", "item 1: expected float, got str"),
        ("attention_impl: fused\n", "expected one of 'eager', 'sdpa', 'flex', 'triton', 'auto', got 'fused'"),
        ("attention_window: many\n", "expected int or null, got str"),
    ],
)
def test_wrong_types(write, text, expected):
    assert expected in str(_error([write("t.yml", text)]))


def test_int_accepted_for_float(write):
    cfg = load_config([write("t.yml", "optimizer: {params: {lr: 1}}\nwarmup: 0\n")])
    assert cfg.optimizer.lr == 1.0 and type(cfg.optimizer.lr) is float
    assert cfg.lr_schedule.warmup == 0.0 and type(cfg.lr_schedule.warmup) is float


def test_hidden_size_not_divisible_by_heads(write):
    path = write("m.yml", "hidden-size: 770\nnum-attention-heads: 12\n")
    error = _error([path])
    assert error.key == ("hidden-size", "num-attention-heads")
    assert path in str(error) and "770" in str(error) and "not divisible" in str(error)


def test_keys_from_two_files_name_both_files(write):
    a = write("a.yml", "hidden-size: 770\n")
    b = write("b.yml", "num-attention-heads: 12\n")
    error = _error([a, b])
    assert a in str(error) and b in str(error)


def test_unknown_positional_embedding(write):
    path = write("pe.yml", "pos_emb: kerple_logg\n")
    error = _error([path])
    assert error.file == path and error.key == "pos_emb"
    assert "did you mean 'kerple_log'?" in str(error) and "alibi" in str(error)


@pytest.mark.parametrize(
    ("text", "key", "detail"),
    [
        ("hidden-dropout: 1.5\n", "hidden-dropout", "must be <= 1.0"),
        ("num-layers: 0\n", "num-layers", "must be >= 1"),
        ("zero_optimization: {stage: 4}\n", "zero_optimization.stage", "0, 1, 2 or 3"),
        ("split: 'a,b'\n", "split", "949,50,1"),
        ("optimizer: {type: SGD}\n", "optimizer.type", "adam, adamw"),
        ("sandwich_dim: 127\n", "sandwich_dim", "even"),
        ("attention_config: [[[local], 12]]\n", "attention_config", "not implemented in kerple"),
        ("min_lr: 0.1\n", "min_lr", "above"),
    ],
)
def test_invalid_values(write, text, key, detail):
    path = write("v.yml", text)
    error = _error([path])
    assert path in str(error) and f"'{key}'" in str(error) and detail in str(error)


def test_derived_key_cannot_be_set(write):
    error = _error([write("d.yml", "padded_vocab_size: 50304\n")])
    assert "cannot be set" in str(error) and error.key == "padded_vocab_size"


def test_block_given_as_a_scalar(write):
    error = _error([write("o.yml", "optimizer: adam\n")])
    assert error.key == "optimizer" and "expected a mapping with keys legacy_fusion, params, type" in str(error)


def test_missing_file(tmp_path):
    missing = str(tmp_path / "nope.yml")
    error = _error([missing])
    assert error.file == missing and "cannot read" in str(error)


def test_invalid_yaml(write):
    path = write("bad.yml", "num_layers: [1, 2\n")
    error = _error([path])
    assert error.file == path and "not valid YAML" in str(error)


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.yml"
    path.write_bytes("num_layers: 2\n# caf\u00e9\n".encode("latin-1"))
    error = _error([str(path)])
    assert error.file == str(path) and "not UTF-8" in str(error) and "0xe9 on line 2" in str(error)


def test_sparsity_config_is_refused_like_local_attention():
    error = _error([], {"sparsity_config": {"block": 16, "different_layout_per_head": True}})
    assert error.key == "sparsity_config" and "sparse attention" in str(error) and "not implemented" in str(error)
    load_config([], {"sparsity_config": {}})  # GPT-NeoX's default: accepted


def test_top_level_must_be_a_mapping(write):
    error = _error([write("list.yml", "- 1\n- 2\n")])
    assert "mapping" in str(error)


def test_override_without_equals_sign():
    with pytest.raises(ConfigError) as info:
        parse_overrides(["seq_length"])
    assert info.value.file == "<command line>" and "key=value" in str(info.value)


def test_split_arguments_feeds_the_loader(write):
    path = write("ok.yml", "seed: 7\n")
    paths, overrides = split_arguments([path, "num-layers=3", "lr=1e-4"])
    assert (paths, overrides) == ([path], ["num-layers=3", "lr=1e-4"])
    cfg = load_config(paths, parse_overrides(overrides))
    assert (cfg.training.seed, cfg.model.num_layers, cfg.optimizer.lr) == (7, 3, 1e-4)


def test_a_gated_activation_is_refused_with_the_choices():
    error = _error([], {"activation": "geglu"})
    assert error.key == "activation" and "not implemented" in str(error)
    assert "use one of gelu, relu, softsign, swish, mish" in str(error)


def test_tensor_parallel_size_must_divide_the_heads(write):
    path = write("tp.yml", "num_attention_heads: 2\nhidden_size: 64\nmodel_parallel_size: 3\n")
    error = _error([path])
    assert error.key == ("model_parallel_size", "num_attention_heads")
    assert "model_parallel_size=3" in str(error) and "num_attention_heads=2" in str(error)


def test_an_override_that_is_not_yaml_names_its_key():
    with pytest.raises(ConfigError) as info:
        parse_overrides(["seed=[1,"])
    assert info.value.key == "seed" and "'[1,'" in str(info.value) and "\n" not in str(info.value)


def test_a_yaml_syntax_error_is_one_line_with_its_position(write):
    path = write("bad2.yml", "a: 1\n  b: 2\n")
    error = _error([path])
    assert "\n" not in str(error) and "(line 2, column 4)" in str(error)


@pytest.mark.parametrize("text", ["lr: .nan\n", "lr: .inf\n", "min_lr: -.inf\n", "hidden-dropout: .nan\n"])
def test_a_number_that_is_not_finite_is_refused_when_the_config_loads(write, text):
    """A NaN learning rate once reached the optimizer (a traceback on rank 0); infinities diverge at step 2."""
    path = write("n.yml", text)
    error = _error([path])
    assert path in str(error) and "must be a finite number" in str(error)


def test_an_absurd_train_iters_is_refused_with_the_bound(write):
    error = _error([write("t.yml", "train_iters: 100000000000000000000000\n")])
    assert error.key == "train_iters" and "must be <= 100000000" in str(error)


def test_a_config_key_given_as_a_word_says_it_needs_a_value(write):
    path = write("ok.yml", "seed: 1\n")
    error = _error([path, "train_iters"])
    assert str(error) == ("<command line>: key 'train_iters': an override needs a value (no file has this name): "
                          "write train_iters=VALUE")
    assert "cannot read the file" in str(_error([path, "no_such_file.yml"]))
