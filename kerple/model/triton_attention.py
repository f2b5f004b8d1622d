"""``attention_impl: triton``: one fused Triton kernel, forward and backward, for attention whose logits carry a
distance-based term, its tables' gradient included (kernels: :mod:`kerple.model.triton_attention_kernels`).

``flex`` trains such a term with the term detached in FlexAttention and its tables' gradient summed by a
second pass that recomputes ``P`` and ``dP`` (:mod:`kerple.model.bias_gradient`); here the backward that
computes ``dq``/``dk``/``dv`` (FlashAttention-2, Dao 2023, Algorithm 2) also sums the ``dS`` tiles it already
has along their diagonals, the gradient of ``bias[h, d]`` and ``scale[h, d]`` in ``x · scale + bias`` (KERPLE,
Chi et al. 2022, Eq. (2)-(4) and §5.3), deterministically.

It joins autograd as a ``torch.library`` custom op whose backward is another custom op: a compiled layer
traces each as one opaque call, and the tables' gradient reaches the embedding's parameters through the
ordinary autograd of the embedding's table function (and of the temperature division the model applies),
as the other kernels' do. Opt-in: ``auto`` never chooses it until a GPU has timed it
(``benchmarks/bias_gradient.py``, ``benchmarks/attention_impls.py``).
"""

from __future__ import annotations

import importlib.util
import os

import torch

BLOCK_DEFAULT = 0  # 0: the kernels' own tile size for the dtype and head dimension


def runs_on(device_type: str) -> bool:
    """Whether the kernels can run on ``device_type``: CUDA with Triton installed, or a CPU when Triton's
    interpreter is on (``TRITON_INTERPRET=1`` before triton is imported: the tests)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device_type == "cuda":
        return True
    return device_type == "cpu" and os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


@torch.library.custom_op("kerple::triton_attention", mutates_args=())
def _forward_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
    scale: torch.Tensor | None, window: int | None, block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output [b, H, L, D], lse [b, H, L] float32)``."""
    from kerple.model.triton_attention_kernels import attention_forward

    return attention_forward(query, key, value, bias, scale, window, block or None)


@_forward_op.register_fake
def _(query, key, value, bias, scale, window, block):  # type: ignore[no-untyped-def]
    from kerple.model.triton_attention_kernels import output_like

    return output_like(query), query.new_empty(query.shape[:3], dtype=torch.float32)


@torch.library.custom_op("kerple::triton_attention_backward", mutates_args=())
def _backward_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, lse: torch.Tensor,
    grad_output: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None, window: int | None,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, dbias, dscale)``; an absent table's gradient is an empty tensor (an op returns no ``None``)."""
    from kerple.model.triton_attention_kernels import attention_backward

    grads = attention_backward(query, key, value, output, lse, grad_output, bias, scale, window, block or None)
    empty = query.new_empty(0, dtype=torch.float32)
    return (*grads[:3], *(empty if g is None else g for g in grads[3:]))  # type: ignore[return-value]


@_backward_op.register_fake
def _(query, key, value, output, lse, grad_output, bias, scale, window, block):  # type: ignore[no-untyped-def]
    tables = (query.new_empty(0, dtype=torch.float32) if t is None else torch.empty_like(t, dtype=torch.float32)
              for t in (bias, scale))
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), *tables


def _setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    query, key, value, bias, scale, window, block = inputs
    attention_output, lse = output
    ctx.save_for_backward(query, key, value, attention_output, lse, bias, scale)
    ctx.window, ctx.block = window, block
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_output, _grad_lse):  # type: ignore[no-untyped-def]
    query, key, value, output, lse, bias, scale = ctx.saved_tensors
    dq, dk, dv, dbias, dscale = torch.ops.kerple.triton_attention_backward(
        query, key, value, output, lse, grad_output, bias, scale, ctx.window, ctx.block)
    grad_bias = None if bias is None else dbias.to(bias.dtype)
    grad_scale = None if scale is None else dscale.to(scale.dtype)
    return dq, dk, dv, grad_bias, grad_scale, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def fused_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
    scale: torch.Tensor | None, window: int | None, block: int = BLOCK_DEFAULT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output, lse)`` of causal attention over ``query``/``key``/``value`` ``[b, H, L, D]`` (fp32, bf16 or
    fp16; head dim at most 128 is what was tested) with logits ``q·kᵀ/√D · scale[h, i - j] + bias[h, i - j]``,
    keys ``i - j < window`` back; the tables are float32 ``[H, L]`` (either may be ``None``) and get their
    gradient through autograd. ``block``: the tile width (0: the kernels' choice; tests use 16)."""
    return torch.ops.kerple.triton_attention(query, key, value, bias, scale, window, block)
