"""Optimizer construction with the reference's parameter groups and defaults (docs/reference-format.md §4).

The reference's ``optimizer: {type: Adam}`` runs DeepSpeed's ``FusedAdam`` whose default is the
decoupled (AdamW) update, so ``adam`` and ``adamw`` both build :class:`torch.optim.AdamW` here; the
two are identical at the paper's ``weight_decay: 0``. ``torch.optim.AdamW`` is passed to DeepSpeed
as an object, which avoids compiling DeepSpeed's CPU Adam kernel and resumes bit-exactly.

Parameter groups follow GPT-NeoX: parameters of normalisation modules and parameters named
``bias`` get no weight decay; everything else (including the KERPLE ``bias_p``/``bias_a`` scalars,
whose names are not exactly ``bias``) does. A parameter shared by several modules (the positional
embedding shared by all layers) is listed once.

Parameters are listed in the order of their checkpoint keys
(:meth:`kerple.checkpoint.neox_layout.NeoxAdapter.parameter_order`): an optimizer state refers to
parameters by position, so this order is part of the checkpoint format.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kerple.training.master_adamw import MasterAdamW

def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Split ``model``'s trainable parameters into decay / no-decay groups (empty groups dropped).

    ``model`` is a :class:`kerple.model.GPTModel` or a pipeline stage of one.
    """
    from kerple.checkpoint.neox_layout import NeoxAdapter

    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in NeoxAdapter.for_model(model).parameter_order(model):
        owner, _, attribute = name.rpartition(".")
        is_norm = "norm" in type(model.get_submodule(owner)).__name__.lower()
        (no_decay if is_norm or attribute == "bias" else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


def _arguments(optimizer_cfg: Any) -> dict[str, Any]:
    """AdamW's hyper-parameters from ``cfg.optimizer``; the lr written here is overwritten by
    AnnealingLR before the first step."""
    beta1, beta2 = (float(beta) for beta in optimizer_cfg.betas)
    return {"lr": float(optimizer_cfg.lr), "betas": (beta1, beta2), "eps": float(optimizer_cfg.eps),
            "weight_decay": float(optimizer_cfg.weight_decay)}


def build_optimizer(model: nn.Module, optimizer_cfg: Any, *, fused: bool = True) -> torch.optim.Optimizer:
    """Build the optimizer of ``cfg.optimizer`` (fields ``lr, betas, eps, weight_decay``; its ``type``,
    Adam or AdamW, is checked when the config loads and runs the same update either way), for
    DeepSpeed to wrap (ZeRO, pipeline, fp16).

    ``fused=True`` (the default) selects torch's fused AdamW kernel, which torch has for CPU and
    CUDA parameters alike: one kernel per parameter group and step instead of a dozen per parameter.
    """
    arguments = _arguments(optimizer_cfg)
    return torch.optim.AdamW(weight_decay_groups(model, arguments["weight_decay"]), fused=fused, **arguments)


def build_master_adamw(model: nn.Module, cfg: Any, parallel: Any) -> MasterAdamW:
    """The optimizer of the single-replica layout (:func:`kerple.training.ds_config.optimizer_steps_itself`):
    :class:`MasterAdamW` with ``cfg``'s hyper-parameters and ``gradient_clipping``; a bf16 run's
    model is cast to bf16 here, its fp32 values kept as the masters."""
    arguments = _arguments(cfg.optimizer)
    dtype = torch.bfloat16 if str(cfg.precision.precision) == "bf16" else torch.float32
    group = parallel.model_parallel_group if parallel.model_parallel_size > 1 else None
    return MasterAdamW(
        weight_decay_groups(model, arguments["weight_decay"]), dtype=dtype,
        max_norm=float(cfg.training.gradient_clipping or 0.0), model_parallel_group=group,
        model_parallel_rank=parallel.model_parallel_rank, **arguments,
    )
