"""The DeepSpeed config emitted from a Config, and the optimizer's parameter groups."""

from __future__ import annotations

import torch

from kerple.config import load_config
from kerple.model import build_model
from kerple.training.ds_config import deepspeed_config, optimizer_steps_itself
from kerple.training.optimizer import build_optimizer
from tiny_run import REPO


def test_batch_triple_precision_and_zero_blocks() -> None:
    cfg = load_config([REPO / "configs/models/162M.yml"], {"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}})
    cfg.resolve_batch(2)
    ds = deepspeed_config(cfg, data_parallel_size=2)
    assert ds["train_batch_size"] == 32 * 4 * 2
    assert ds["train_micro_batch_size_per_gpu"] == 32
    assert ds["gradient_accumulation_steps"] == 4
    assert ds["gradient_clipping"] == 1.0
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["bf16"] == {"enabled": True, "check_grad_overflow": False}  # fp16: {enabled, type: bfloat16} means bf16
    assert "fp16" not in ds


def test_bf16_at_zero_stage_0_leaves_precision_and_clipping_to_the_optimizer() -> None:
    """ZeRO 0 without a pipeline: MasterAdamW holds the fp32 masters and clips, so DeepSpeed gets
    neither a bf16 block (its unfused wrapper) nor gradient_clipping (its per-parameter clipping)."""
    cfg = load_config([REPO / "configs/models/162M.yml"]).resolve_batch(1)
    assert optimizer_steps_itself(cfg) and cfg.training.gradient_clipping == 1.0
    ds = deepspeed_config(cfg, data_parallel_size=1)
    assert "bf16" not in ds and "fp16" not in ds and ds["gradient_clipping"] == 0.0
    piped = load_config([REPO / "configs/models/162M.yml"], {"pipe_parallel_size": 2}).resolve_batch(2)
    assert not optimizer_steps_itself(piped)
    assert deepspeed_config(piped, data_parallel_size=1)["bf16"] == {"enabled": True, "check_grad_overflow": False}
    fp16 = load_config([REPO / "configs/models/162M.yml"], {"fp16": {"enabled": True, "type": None}}).resolve_batch(1)
    assert not optimizer_steps_itself(fp16) and deepspeed_config(fp16, data_parallel_size=1)["gradient_clipping"] > 0


def test_fp16_block_carries_loss_scaling() -> None:
    cfg = load_config([REPO / "configs/models/1-3B.yml"]).resolve_batch(2)
    ds = deepspeed_config(cfg, data_parallel_size=1)
    assert ds["fp16"]["enabled"] is True
    assert ds["fp16"]["initial_scale_power"] == 12
    assert ds["fp16"]["loss_scale"] == 0
    assert "bf16" not in ds


def test_fp32_has_no_precision_block() -> None:
    cfg = load_config([REPO / "configs/models/tiny.yml"]).resolve_batch(1)
    ds = deepspeed_config(cfg, data_parallel_size=1)
    assert "fp16" not in ds and "bf16" not in ds


def test_parameter_groups_follow_reference() -> None:
    cfg = load_config([REPO / "configs/models/tiny.yml"], {"pos_emb": "kerple_log", "weight_decay": 0.1, "vocab_size": 64,
                                                           "make_vocab_size_divisible_by": 8})
    model = build_model(cfg)
    optimizer = build_optimizer(model, cfg.optimizer)
    assert isinstance(optimizer, torch.optim.AdamW)
    decay, no_decay = optimizer.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "positional.bias_p" in decayed  # named bias_p, not "bias"
    assert all(n.endswith(".bias") or "norm" in n for n in not_decayed)
    assert any("layernorm.weight" in n for n in not_decayed)
    total = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == total
