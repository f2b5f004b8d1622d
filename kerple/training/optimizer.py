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


def build_optimizer(model: nn.Module, optimizer_cfg: Any, *, fused: bool = False) -> torch.optim.Optimizer:
    """Build the optimizer of ``cfg.optimizer`` (fields ``lr, betas, eps, weight_decay``; its ``type``,
    Adam or AdamW, is checked when the config loads and runs the same update either way).

    ``fused=True`` selects torch's fused AdamW kernel (CUDA only; the trainer asks for it on GPUs).
    """
    beta1, beta2 = (float(beta) for beta in optimizer_cfg.betas)
    weight_decay = float(optimizer_cfg.weight_decay)
    # The lr written here is overwritten by AnnealingLR before the first step.
    return torch.optim.AdamW(
        weight_decay_groups(model, weight_decay),
        lr=float(optimizer_cfg.lr),
        betas=(beta1, beta2),
        eps=float(optimizer_cfg.eps),
        weight_decay=weight_decay,
        fused=fused,
    )
