"""The first step's check that every trainable positional parameter got a gradient.

A positional embedding trains through the attention kernel: eager attention, SDPA's mask gradient,
the fused CPU backward (``sdpa_cpu``) or the tables' separate reduction under FlexAttention
(:mod:`kerple.model.bias_gradient`). A kernel that drops that gradient does not fail: the loss
falls anyway, and the embedding keeps its initial values for the whole run. On an H200 (torch 2.11)
compiled layers through SDPA did this to ``kerple_log`` (docs/gpu-report.md). So the trainer looks
once, after the first backward of the run: a trainable positional parameter whose gradient is
missing or zero in every entry stops the run with what to change. One device read, once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kerple.training.errors import TrainingError


def ungraded_parameters(model: nn.Module) -> list[str]:
    """Names (under ``model``) of its trainable positional parameters whose gradient is ``None`` or
    zero everywhere; reads the device once. A model without ``positional_parameters`` has none."""
    positional = getattr(model, "positional_parameters", None)
    if positional is None:
        return []
    wanted = {id(p) for p in positional() if p.requires_grad}
    named = [(name, p) for name, p in model.named_parameters() if id(p) in wanted]
    missing = [name for name, p in named if p.grad is None]
    present = [(name, p.grad) for name, p in named if p.grad is not None]
    if present:
        nonzero = torch.stack([grad.ne(0).any() for _, grad in present]).tolist()
        missing += [name for (name, _), moved in zip(present, nonzero) if not moved]
    return sorted(missing)


def check_positional_gradients(model: nn.Module, cfg: Any, device: torch.device) -> None:
    """Raise :class:`TrainingError` naming the parameters :func:`ungraded_parameters` finds, the kernel
    and the settings to change."""
    missing = ungraded_parameters(model)
    if not missing:
        return
    impl = model.resolve_attention_impl(device.type, True, int(cfg.model.seq_length))
    compiled = bool(getattr(model, "compiled_layers", False))
    raise TrainingError(
        f"{', '.join(missing)} got no gradient in the first training step: attention_impl {impl!r} "
        f"({'compiled' if compiled else 'eager'} layers, {device.type}) did not differentiate the positional "
        "term, so the embedding would keep its initial values for the whole run. Change 'attention-impl' "
        "(auto picks a kernel that trains it; eager is the reference math) or set 'compile: false', and run "
        "again; nothing was saved."
    )
