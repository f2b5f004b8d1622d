"""The real GPT-NeoX and KERPLE-fork config files (vendored under tests/fixtures/neox_configs/,
values only) load as their README combines them, or are refused with one line naming the feature."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kerple.config import ConfigError, load_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "neox_configs"
FORK, NEOX = FIXTURES / "kerple_fork", FIXTURES / "neox_current"

FORK_MODELS = ["small", "medium", "large", "XL", "2-7B", "6-7B", "13B", "20B", "175B", "small_bf16"]
NEOX_MODELS = ["1-3B", "125M", "125M-json", "13B", "175B", "19M", "2-7B", "20B", "350M", "49M", "6-7B", "760M", "800M",
               "bf16_125M", "slurm_125M"]
PYTHIA = ["14M", "31M", "70M", "160M", "410M", "1B", "1-4B", "2-8B", "6-9B", "12B"]
REFUSED = {
    FORK / "bnb_small.yml": "bitsandbytes",
    FORK / "gmlp_small.yml": "['gmlp']",
    FORK / "sparse.yml": "['local']",
    NEOX / "bnb_125M.yml": "bitsandbytes",
    NEOX / "125M-dmoe.yml": "mixture of experts",
    NEOX / "1-3B-transformer-engine.yml": "Transformer Engine",
    NEOX / "sparse.yml": "['local']",
    NEOX / "gmlp_small.yml": "'1.0e_8'",  # a typo in GPT-NeoX's own file
    NEOX / "llama2" / "7B.yml": "swiglu",
    NEOX / "mistral" / "7B.yml": "swiglu",
    NEOX / "mamba" / "mamba-130M.yml": "single_residual_scaled_normal",
    NEOX / "rwkv" / "170M.yml": "bf16.bf16",  # fp16 keys in the bf16 block: DeepSpeed refuses them too
}


def test_the_fixtures_name_their_source():
    files = sorted(FIXTURES.rglob("*.yml"))
    assert len(files) == 51
    for path in files:
        header = path.read_text(encoding="utf-8").splitlines()[0]
        assert header.startswith("# Vendored from github.com/") and "Apache-2.0" in header, path


@pytest.mark.parametrize("name", FORK_MODELS)
def test_fork_model_loads_alone_and_with_its_local_setup(name):
    alone = load_config([FORK / f"{name}.yml"])
    assert alone.precision.precision == ("bf16" if name == "small_bf16" else "fp16")
    combined = load_config([FORK / f"{name}.yml", FORK / "kerple_configs" / "local_setup.yml"])
    assert combined.data.vocab_file == "data/gpt2-vocab.json" and combined.logging.use_wandb is False


@pytest.mark.parametrize("name", NEOX_MODELS + [f"pythia/{size}" for size in PYTHIA])
def test_neox_model_loads_alone_and_with_local_setup(name):
    load_config([NEOX / f"{name}.yml"])
    cfg = load_config([NEOX / f"{name}.yml", NEOX / "local_setup.yml"])
    assert cfg.data.data_path == "data/enwik8/enwik8_text_document" and cfg.checkpointing.save == "checkpoints"


def test_values_of_the_fork_small_model():
    cfg = load_config([FORK / "small.yml"])
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (12, 768, 12, 2048)
    assert cfg.positional.pos_emb == "rotary"
    assert (m.hidden_dropout, cfg.optimizer.weight_decay, cfg.training.gradient_clipping) == (0.0, 0.0, 1.0)
    assert (cfg.training.eval_iters, cfg.data.split) == (10, "949,50,1")
    assert cfg.precision.loss_scale_window == 1000 and cfg.parallelism.zero_stage == 0
    large = load_config([FORK / "20B.yml"])
    assert large.positional.rotary_pct == 0.25 and large.model.gpt_j_residual is True
    assert large.data.tokenizer_type == "HFTokenizer" and large.precision.initial_scale_power == 12


def test_values_of_neox_125m():
    cfg = load_config([NEOX / "125M.yml"])
    assert cfg.checkpointing.save_interval == 10000  # checkpoint_factor, linear scale
    assert (cfg.model.init_method, cfg.model.output_layer_init_method) == ("small_init", "wang_init")
    assert cfg.optimizer.betas == [0.9, 0.95] and cfg.lr_schedule.min_lr == 6e-5
    assert cfg.parallelism.zero_optimization["overlap_comm"] is True
    pythia = load_config([NEOX / "pythia" / "160M.yml"])
    assert pythia.attention.attention_config == [[["flash"], 12]]


def test_kerple_training_template_loads_with_an_embedding():
    """kerple_configs/train.yml is composed with a pos_emb by the fork's generate_ymls.py."""
    with pytest.raises(ConfigError, match="learned"):
        load_config([FORK / "kerple_configs" / "train.yml"])  # seq_length_val 2048 > the 512-row learned table
    cfg = load_config([FORK / "kerple_configs" / "train.yml"], {"pos_emb": "kerple_log"})
    assert cfg.data.seq_length_val == 2048 and cfg.precision.precision == "bf16"


@pytest.mark.parametrize("path", list(REFUSED), ids=lambda path: str(path.relative_to(FIXTURES)))
def test_configs_of_missing_features_are_refused_in_one_line(path):
    with pytest.raises(ConfigError) as info:
        load_config([path])
    message = str(info.value)
    assert str(path) in message and REFUSED[path] in message and "\n" not in message


def test_accepted_keys_without_effect_are_listed_once(caplog):
    with caplog.at_level(logging.INFO, logger="kerple.config"):
        load_config([NEOX / "125M.yml", NEOX / "local_setup.yml"])
    notes = [record.getMessage() for record in caplog.records if "without effect" in record.getMessage()]
    assert len(notes) == 1
    note = notes[0]
    assert "rope_fusion = false" in note and "partition_activations = true" in note
    assert 'hostfile = "/mock_path"' in note and "deepy.py --hostfile" in note
    assert f"({NEOX / 'local_setup.yml'})" in note and "checkpoint_validation_with_forward_pass" in note
    assert "checkpoint_factor" not in note  # it has an effect: the save interval
