"""A reference-style config loads to the paper's values; to_dict/save_yaml round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kerple.config import load_config

pytestmark = pytest.mark.usefixtures("fake_attention")

REFERENCE_162M = str(Path(__file__).with_name("reference_162M.yml"))


def test_reference_162m_config_loads_to_the_paper_values():
    cfg = load_config([REFERENCE_162M])
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (12, 768, 12, 512)
    assert (m.head_dim, m.padded_vocab_size, m.no_weight_tying) == (64, 50304, True)
    assert cfg.positional.pos_emb == "rpe"  # "t5" stored canonically
    assert cfg.positional.rotary_pct == 0.25 and cfg.positional.rotary_emb_base == 10000.0
    assert cfg.attention.attention_impl == "sdpa"
    o = cfg.optimizer
    assert (o.type, o.lr, o.betas, o.eps, o.weight_decay) == ("Adam", 0.0006, [0.9, 0.999], 1e-8, 0.0)
    s = cfg.lr_schedule
    assert (s.lr_decay_style, s.lr_decay_iters, s.warmup, s.min_lr) == ("cosine", 50000, 0.01, 6e-5)
    assert cfg.precision.precision == "bf16"  # legacy fp16 block with type bfloat16
    assert cfg.parallelism.zero_stage == 0 and cfg.parallelism.zero_optimization["reduce_bucket_size"] == 500000000
    assert (cfg.parallelism.pipe_parallel_size, cfg.parallelism.num_gpus) == (1, 2)
    assert cfg.data.split == "949,50,1" and cfg.data.seq_length_val == 2048
    assert cfg.data.data_path == "data/enwik8/enwik8_text_document"
    t = cfg.training
    assert (t.micro_batch_size, t.train_iters, t.gradient_clipping, t.checkpoint_activations) == (32, 50000, 1.0, True)
    assert (t.eval_interval, t.eval_iters, t.seed) == (1000, 10, 1234)
    assert (cfg.logging.log_interval, cfg.logging.wandb_project, cfg.logging.use_tensorboard) == (100, "neox", True)
    c = cfg.checkpointing
    assert (c.save, c.load, c.save_interval, c.keep_last_n_checkpoints) == ("checkpoints", "checkpoints", 1000, 4)
    # accepted for compatibility and kept
    assert cfg.model.output_layer_parallelism == "column" and cfg.training.synchronize_each_layer is True
    assert cfg.parallelism.hostfile == "/job/hostfile" and cfg.parallelism.include == "localhost:0,1"


def test_to_dict_uses_canonical_keys_and_resolved_values():
    data = load_config([REFERENCE_162M]).resolve_batch(2).to_dict()
    flat_keys = [key for key, value in data.items() if not isinstance(value, dict)]
    assert all("-" not in key for key in flat_keys)
    assert data["hidden_size"] == 768 and "hidden-size" not in data
    assert data["pos_emb"] == "rpe"
    assert data["micro_batch_size"] == 32 and data["gradient_accumulation_steps"] == 1
    assert data["train_batch_size"] == 64  # 32 x 1 x (2 processes / (1 x 1))
    assert data["max_position_embeddings"] == 512
    assert data["optimizer"] == {
        "type": "Adam",
        "params": {"lr": 0.0006, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
    }
    assert data["fp16"]["enabled"] is True and data["fp16"]["type"] == "bfloat16"
    assert data["bf16"]["enabled"] is False and data["bf16"]["check_grad_overflow"] is False  # kerple: off
    assert "fp16" not in data["fp16"]  # no-effect keys left at their default are not written
    assert data["precision"] == "bf16"
    assert "padded_vocab_size" not in data and "head_dim" not in data  # derived, recomputed on load


def test_save_yaml_round_trip(tmp_path):
    cfg = load_config([REFERENCE_162M], {"seq_length": 256, "attention_window": 64}).resolve_batch(4)
    target = tmp_path / "saved.yml"
    cfg.save_yaml(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved.yml"]  # no temporary left behind
    assert yaml.safe_load(target.read_text()) == cfg.to_dict()
    again = load_config([str(target)])
    assert again.to_dict() == cfg.to_dict()
    assert again.model.seq_length == 256 and again.attention.attention_window == 64
    assert again.parallelism.world_size is None  # derived by resolve_batch, not saved
    assert again.resolve_batch(4).training.train_batch_size == 128  # 32 x 1 x 4
    assert again == cfg


def test_round_trip_of_defaults(tmp_path):
    cfg = load_config([])
    cfg.save_yaml(tmp_path / "defaults.yml")
    assert load_config([str(tmp_path / "defaults.yml")]) == cfg
