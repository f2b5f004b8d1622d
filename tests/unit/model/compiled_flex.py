"""The compiled FlexAttention path of a CUDA GPU, run on a CPU for tests.

On CUDA ``torch.compile(flex_attention)`` goes through AOTAutograd, which builds the backward (the
gradients of the captured tensors included) before Inductor writes Triton kernels. On CPU, torch
2.13 refuses FlexAttention with ``requires_grad`` inputs (``_validate_device``) and kerple refuses
``flex`` for CPU training (GPT models). :func:`compiled_cpu_flex` lifts both, in the test only, and compiles
with ``backend="aot_eager"``: the same AOTAutograd graphs, run by eager operators instead of
Triton. A gradient lost under compilation is lost here too (as KERPLE's parameters once were).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch.nn.attention.flex_attention as flex_module

import kerple.model.gpt as gpt_module
from kerple.model.flex_base import FlexKernel


@contextlib.contextmanager
def compiled_cpu_flex(monkeypatch: pytest.MonkeyPatch, *kernels: FlexKernel) -> Iterator[torch._dynamo.testing.CompileCounterWithBackend]:
    """``kernels`` compile FlexAttention with ``aot_eager`` and may train on CPU, inside the block.

    Yields the backend's counter: a test asserts frames were compiled (the compiled path ran, not
    Dynamo's silent fallback to the uncompiled function, which the recompile guard turns into an error).
    """
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(flex_module, "_validate_device", lambda query, key, value: None)
    monkeypatch.setattr(gpt_module, "unsupported_reason", _training_allowed(gpt_module.unsupported_reason))
    for kernel in kernels:
        monkeypatch.setattr(kernel, "_compiled_attention", torch.compile(flex_module.flex_attention, backend=counter,
                                                                          dynamic=False))
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=64):
        yield counter
    torch._dynamo.reset()


def _training_allowed(original):  # type: ignore[no-untyped-def]
    """``unsupported_reason`` judging every kernel as in evaluation (lifts the CPU flex-training refusal)."""

    def reason(impl, kind, device_type, training=False):  # type: ignore[no-untyped-def]
        return original(impl, kind, device_type, False)

    return reason
