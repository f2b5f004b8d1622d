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

OPTIMIZER_TYPES = ("adam", "adamw")
DEFAULT_BETAS = (0.9, 0.999)
DEFAULT_EPS = 1e-8


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
    """Build the optimizer described by ``cfg.optimizer`` (fields ``type, lr, betas, eps, weight_decay``).

    ``fused=True`` selects torch's fused AdamW kernel (CUDA only; the trainer asks for it on GPUs).
    """
    kind = str(getattr(optimizer_cfg, "type", "adam") or "adam").lower()
    if kind not in OPTIMIZER_TYPES:
        raise ValueError(
            f"optimizer.type {kind!r} is not supported; use one of {', '.join(OPTIMIZER_TYPES)}"
        )
    betas = tuple(getattr(optimizer_cfg, "betas", None) or DEFAULT_BETAS)
    eps = getattr(optimizer_cfg, "eps", None)
    weight_decay = float(getattr(optimizer_cfg, "weight_decay", 0.0) or 0.0)
    groups = weight_decay_groups(model, weight_decay)
    # The lr written here is overwritten by AnnealingLR before the first step.
    return torch.optim.AdamW(
        groups,
        lr=float(optimizer_cfg.lr),
        betas=(float(betas[0]), float(betas[1])),
        eps=DEFAULT_EPS if eps is None else float(eps),
        weight_decay=weight_decay,
        fused=fused,
    )
