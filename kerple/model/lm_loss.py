"""The LM head and its cross entropy in one pass over chunks of tokens: no ``[tokens, vocab]`` fp32 logits.

``linear_cross_entropy(hidden, weight, labels)`` equals
``F.cross_entropy(F.linear(hidden, weight).float(), labels, ignore_index=-100)`` (the mean over the
tokens whose label is not ignored) and its gradients, while holding the logits of at most
``chunk_tokens`` positions at a time. The loss is the last operation of a training forward, so the
gradient of each chunk is known in the forward pass already: ``softmax(logits) - onehot(label)``
divided by the number of counted tokens (the standard cross-entropy derivative). Each chunk's
logits are therefore made once, turned into that gradient in place, multiplied back into the
gradients of ``hidden`` and ``weight``, and dropped; the backward pass only scales the stored
gradients by the incoming one. This is the scheme of Liger Kernel's fused linear cross entropy
(Hsu et al. 2024), written in plain PyTorch so that the same code runs on every device.

Precision follows the unfused computation: the matmuls run in the compute dtype (the autocast
dtype inside a mixed-precision forward, else ``hidden``'s dtype), the softmax in fp32, the
gradient of the logits is rounded to the compute dtype before its matmuls (as the backward of
``logits.float()`` does), and the weight's gradient is summed over chunks in fp32.

With ``compiled=True`` (the trainer passes ``training.compile``) the per-chunk work after the
logits' matmul is one ``torch.compile``\ d function, :func:`chunk_terms`: Inductor turns the row's
log-sum-exp and the gradient into two passes over the compute-dtype logits, where the eager
operators make about six over an fp32 copy (on an H200 the eager ones, then eight, took 22% of a
compiled 162M step's GPU time, docs/gpu-report.md). The same function runs eagerly otherwise: one definition of the math.

Memory: a chunk holds at most ``chunk_tokens x vocab`` x 6 bytes at once in bf16 (its logits in
fp32, which become the gradient, beside either the bf16 logits or the bf16 gradient), against
``tokens x vocab`` x about 14 bytes for the unfused loss and its backward.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch

IGNORE_INDEX = -100

# fp32 logits held per chunk at most. Each chunk costs about twenty kernel launches eagerly, a few
# compiled, so the budget trades memory for launches: at a 50,304-word vocabulary a 162M step of
# 32 x 512 tokens runs in 13 chunks of 1,261 positions (254 MB of fp32 logits, 380 MB with the bf16
# gradient beside them), a micro-batch of 512 tokens in 1. At 1 GiB (4 chunks) the loss held
# 1.2 GB where the forward's activations are all alive, the likely peak of a step; the ~180 extra
# launches cost about 1 ms of host time, inside the ~10 ms by which the host now finishes a 162M
# step before the device (H200, docs/gpu-report.md).
CHUNK_BYTES = 2**28


def chunk_tokens_for(tokens: int, vocab: int, budget: int = CHUNK_BYTES) -> int:
    """Positions per chunk for ``tokens`` positions: the fewest chunks whose fp32 log-probabilities
    take at most ``budget`` bytes each, made equal in size."""
    most = max(1, budget // (4 * vocab))
    chunks = -(-tokens // most)
    return -(-tokens // chunks)


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of ``tensor`` runs in here: the autocast dtype when autocast is on for its device."""
    device = tensor.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return tensor.dtype


def chunk_terms(logits: torch.Tensor, target: torch.Tensor, share: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss [c, 1] fp32, d loss / d logits [c, V] in logits' dtype)`` of one chunk: each row's
    ``logsumexp - logit[target]`` and ``(softmax - onehot(target)) · share`` (the cross-entropy
    derivative; ``share [c, 1]``: each token's share of the mean, 0 for an ignored one), in fp32.

    The log-sum-exp is taken by hand (row maximum, ``exp`` in place, row sum) rather than by
    ``torch.logsumexp``, whose eager kernel allocates a second ``[c, V]`` fp32 buffer for
    ``logits - max``; the same ``exp`` then serves the softmax. The target's entry is written last
    from its probability ``exp(-loss)``, so ``p - 1`` is formed in fp32 (p·share - share in the low
    dtype would cancel), and only then is the gradient rounded to ``logits``' dtype (a CPU's
    16-bit ``scatter_`` would copy the chunk to fp32 first). So a chunk holds its fp32 copy and,
    at the end, the rounded gradient: 6 bytes per logit in bf16. Eagerly the fp32 copy becomes the
    gradient in place (fp32 logits are overwritten: pass the chunk's own)."""
    dtype = logits.dtype
    wide = logits.float()
    del logits  # eagerly, a 16-bit chunk's logits are freed here
    loss, total = row_losses_(wide, target)  # wide: exp(logits - row max)
    grad = wide.mul_(share / total)
    grad.scatter_(1, target, torch.exp(-loss).sub_(1.0).mul_(share))
    return loss, grad.to(dtype)


def row_losses_(wide: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logsumexp - logit[target], sum of exp(logit - row max))``, both ``[c, 1]``, of fp32 logits
    ``wide [c, V]``, which become ``exp(logit - row max)`` in place (:func:`chunk_terms`' docstring)."""
    picked = wide.gather(1, target)
    row_max = wide.amax(dim=1, keepdim=True)
    total = wide.sub_(row_max).exp_().sum(dim=1, keepdim=True)
    return row_max + total.log() - picked, total


@functools.cache
def _chunk_terms(compiled: bool) -> Any:
    """:func:`chunk_terms`, or its ``torch.compile`` (made once, on first use)."""
    return torch.compile(chunk_terms, dynamic=False) if compiled else chunk_terms


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
    ignore_index: int = IGNORE_INDEX, chunk_tokens: int | None = None, compiled: bool = False,
) -> torch.Tensor:
    """Mean cross entropy of ``hidden [..., h] @ weight[V, h]ᵀ`` against ``labels [...]`` (``ignore_index``
    not counted; 0 when every label is ignored), as an fp32 scalar.

    With autograd on for ``hidden`` or ``weight``, the gradients are made chunk by chunk in the
    forward pass (module docstring); otherwise only the loss is computed, in the same chunks.
    ``compiled``: the gradient's per-chunk work through Inductor (module docstring).
    """
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # [N, h]
    flat_labels = labels.reshape(-1)  # [N]
    chunk = chunk_tokens or chunk_tokens_for(flat_labels.shape[0], weight.shape[0])
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(flat_hidden, weight, flat_labels, chunk, ignore_index, compiled)
    with torch.no_grad():
        return _forward(flat_hidden, weight, flat_labels, chunk, ignore_index, (False, False))[0]


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss in the forward, with the gradients of ``hidden`` and ``weight`` kept for the backward."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int,
                ignore_index: int, compiled: bool) -> torch.Tensor:
        wanted = (hidden.requires_grad, weight.requires_grad)
        loss, grad_hidden, grad_weight = _forward(hidden, weight, labels, chunk, ignore_index, wanted, compiled)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_loss  # a 0-dim factor keeps grad_hidden's dtype
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_loss).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _forward(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int, ignore_index: int,
    wanted: tuple[bool, bool], compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(loss, d loss / d hidden or None, d loss / d weight in fp32 or None)`` over ``hidden [N, h]``.

    Every per-chunk tensor is a view made by one ``split`` up front, so a chunk costs the same dozen
    kernel launches however many chunks there are. The weight's gradient is summed transposed,
    ``[h, V]``, which spares each chunk a transpose.
    """
    dtype = compute_dtype(hidden)
    keep = labels != ignore_index  # [N]
    count = keep.sum().clamp(min=1)
    targets = torch.where(keep, labels, 0).unsqueeze(1)  # [N, 1]
    share = torch.div(keep, count).unsqueeze(1)  # [N, 1] fp32: each counted token's share of the mean
    losses = torch.empty(labels.shape[0], 1, dtype=torch.float32, device=hidden.device)  # [N, 1]
    with torch.autocast(hidden.device.type, enabled=False):  # dtypes are explicit below
        low_hidden = hidden if hidden.dtype == dtype else hidden.to(dtype)
        low_weight = weight if weight.dtype == dtype else weight.to(dtype)
        low_weight_t = low_weight.t()  # [h, V]
        grad_hidden = torch.empty_like(low_hidden) if wanted[0] else None  # [N, h]
        grad_weight_t = torch.zeros(low_weight_t.shape, dtype=torch.float32, device=weight.device) if wanted[1] else None
        splits = [t.split(chunk) for t in (low_hidden, targets, share, losses)]
        pieces_t = low_hidden.t().split(chunk, dim=1)  # [h, c] each
        grad_hidden_pieces = itertools.repeat(None) if grad_hidden is None else grad_hidden.split(chunk)
        terms = _chunk_terms(compiled)
        for piece, target, piece_share, piece_losses, piece_t, piece_grad_hidden in zip(
                *splits, pieces_t, grad_hidden_pieces):
            if not any(wanted):  # validation: the losses alone, the fp32 logits overwritten in place
                piece_losses.copy_(row_losses_(torch.mm(piece, low_weight_t).float(), target)[0])
                continue
            piece_loss, grad_logits = terms(torch.mm(piece, low_weight_t), target, piece_share)  # logits [c, V]
            piece_losses.copy_(piece_loss)
            if piece_grad_hidden is not None:
                torch.mm(grad_logits, low_weight, out=piece_grad_hidden)  # [c, h]
            if grad_weight_t is not None:
                grad_weight_t += torch.mm(piece_t, grad_logits)  # [h, V]
            del grad_logits  # else it is alive while the next chunk's are made
    loss = (losses * share).sum()
    if grad_hidden is not None and grad_hidden.dtype != hidden.dtype:
        grad_hidden = grad_hidden.to(hidden.dtype)
    return loss, grad_hidden, None if grad_weight_t is None else grad_weight_t.t()
