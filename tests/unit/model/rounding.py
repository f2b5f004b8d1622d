"""How far half-precision rounding inside an attention kernel can move each gradient: a bound from a model.

A fused attention kernel in bf16/fp16 rounds, per score, the score ``s = q·kᵀ/√d``, the probability
``p`` it multiplies into ``V`` and the score's gradient ``dS`` it multiplies into ``K``/``Q``; each
rounding is a relative error of at most ``u = eps/2`` of the dtype. A positional parameter's
gradient is a sum over every score of ``dS · ∂l/∂θ``: errors of independent roundings add in
quadrature, and terms of both signs cancel (a KERPLE exponent's gradient is ~40x smaller than the
sum of its terms' magnitudes), so a tolerance proportional to the gradient decides on noise on one
CPU and passes on another.

:func:`score_rounding_spread` measures the model's sensitivity instead: it runs the model in fp32
with a dense attention of its own in which every score, probability and score gradient is
multiplied by ``1 ± u`` (independent random signs: each rounding at its worst magnitude), and
returns, per parameter, the root-mean-square change of the gradient over several such draws. A
kernel whose only error is its rounding lands within a few of these standard deviations
(:data:`SIGMAS`) of another correct kernel in the same dtype; a lost or mis-scaled gradient lands
as far off as the defect. The bound depends on the model, the data and the dtype, not on the CPU.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

import torch
from torch import nn

import kerple.model.attention as attention_module

SIGMAS = 4.0  # standard deviations of the rounding model a correct kernel stays within
PROBES = 16  # random rounding draws the spread is estimated from

Run = Callable[[nn.Module], tuple[torch.Tensor, dict[str, torch.Tensor | None]]]


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the backward multiplies the incoming gradient by ``factor`` (dS's rounding)."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(factor)
        return values.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (factor,) = ctx.saved_tensors
        return grad * factor, None


def _rounded_attention(unit_roundoff: float, generator: torch.Generator) -> Callable[..., torch.Tensor]:
    """Dense causal attention (``softmax(s·w + b) V`` over the context's terms and mask) whose score,
    probability and score gradient each carry a relative error of ``±unit_roundoff``."""

    def factor(shape: torch.Size, device: torch.device) -> torch.Tensor:
        signs = torch.randint(0, 2, shape, generator=generator).to(device) * 2.0 - 1.0
        return 1.0 + unit_roundoff * signs

    def kernel(query, key, value, context, training):  # type: ignore[no-untyped-def]
        batch, heads = query.shape[:2]
        scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) / math.sqrt(query.shape[-1])  # [b, H, q, k]
        scores = scores * factor(scores.shape, scores.device)
        scale, bias = context.dense_scale(batch, heads), context.dense_bias(batch, heads)
        logits = scores * scale if scale is not None else scores
        logits = logits + bias if bias is not None else logits
        logits = _ScaleGradient.apply(logits, factor(logits.shape, logits.device))
        probs = torch.softmax(logits.masked_fill(~context.allowed(), float("-inf")), dim=-1)
        probs = probs * factor(probs.shape, probs.device)
        return torch.matmul(probs, value.float()).to(value.dtype)  # [b, H, q, d]

    return kernel


@contextlib.contextmanager
def _eager_replaced(kernel: Callable[..., torch.Tensor]) -> Iterator[None]:
    original = attention_module.KERNELS["eager"]
    attention_module.KERNELS["eager"] = kernel
    try:
        yield
    finally:
        attention_module.KERNELS["eager"] = original


def score_rounding_spread(model: nn.Module, run: Run, dtype: torch.dtype, probes: int = PROBES,
                          seed: int = 0) -> dict[str, torch.Tensor]:
    """Per parameter, the RMS change of its gradient when ``run(model)`` (one forward and backward
    through the ``eager`` kernel) attends with every score, probability and score gradient rounded
    to ``dtype`` at the worst magnitude with a random sign. ``model`` should be fp32 (the rounded
    weights of the half-precision model under test)."""
    unit_roundoff = torch.finfo(dtype).eps / 2
    _, exact = run(model)
    squares = {key: torch.zeros_like(grad, dtype=torch.float64) for key, grad in exact.items() if grad is not None}
    generator = torch.Generator().manual_seed(seed)
    with _eager_replaced(_rounded_attention(unit_roundoff, generator)):
        for _ in range(probes):
            _, rounded = run(model)
            for key, total in squares.items():
                total += (rounded[key].double() - exact[key].double()).square()
    return {key: (total / probes).sqrt().float() for key, total in squares.items()}


def rounding_bound(spread: torch.Tensor) -> float:
    """The largest ``‖a - b‖`` two correct half-precision kernels may differ by, for a gradient whose
    rounding spread is ``spread``."""
    return SIGMAS * spread.norm().item()
