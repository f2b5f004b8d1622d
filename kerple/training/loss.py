"""The module DeepSpeed drives: the language model plus its loss.

Wrapping the loss inside the engine's module means ``engine(tokens, labels)`` returns the scalar
that ``engine.backward`` needs, and tensor parallelism can swap in a vocab-parallel cross entropy
without the trainer knowing. Checkpoints are written from ``LanguageModelLoss.model`` so their keys
are the model's own.

Without a ``loss_fn`` the model computes its LM head and the loss together
(:func:`kerple.model.lm_loss.linear_cross_entropy`), so the ``[b, s, V]`` logits are never held in
fp32; with one (the vocab-parallel loss of tensor parallelism, the pipeline's last stage) the
model's logits are handed to it.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross entropy in fp32: ``logits [b, s, V]``, ``labels [b, s]`` (-100 ignored)."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


class LanguageModelLoss(nn.Module):
    """``forward(tokens [b, s], labels [b, s]) -> scalar mean loss``."""

    def __init__(self, model: nn.Module, loss_fn: LossFn | None = None) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is None:
            return self.model(tokens, labels=labels)  # the LM head fused with the loss
        logits = self.model(tokens)  # [b, s, V] (V local to the rank under tensor parallelism)
        return self.loss_fn(logits, labels)
