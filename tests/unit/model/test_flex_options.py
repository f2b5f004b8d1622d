"""FlexAttention kernel options: PyTorch's published defaults, the shared-memory estimate against the
out-of-resource reports of an H100, the ladder's rungs, and the ladder itself with injected failures
(CPU: a fake compiled function raises what Inductor raises on a GPU)."""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Callable

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed
from torch._inductor.exc import InductorError
from torch.nn.attention.flex_attention import flex_attention

from kerple.model import flex_base
from kerple.model.flex import FlexAttentionKernel
from kerple.model.flex_options import (
    BackwardConfig,
    DeviceLimits,
    ForwardConfig,
    backward_shared_memory,
    choose_configs,
    default_backward,
    default_forward,
    forward_shared_memory,
    is_out_of_resource,
    kernel_options,
    smaller_backward,
    smaller_forward,
)
from kerple.positional.logit_term import distance_table_term

H100 = DeviceLimits("NVIDIA H100 80GB HBM3", (9, 0), 232448)  # Triton's reported hardware limit
A10 = DeviceLimits("NVIDIA A10", (8, 6), 101376)  # 99 KiB opt-in


def test_pytorch_defaults_for_head_dim_64_are_the_published_ones() -> None:
    assert default_forward((9, 0), 64, torch.bfloat16) == ForwardConfig(128, 128, 3, 4)
    assert default_backward((9, 0), 64, torch.bfloat16) == BackwardConfig(64, 128, 128, 64, 3, 8)
    assert default_forward((8, 0), 64, torch.bfloat16) == ForwardConfig(128, 64, 3, 4)
    assert default_backward((8, 0), 64, torch.float16) == BackwardConfig(64, 64, 64, 64, 2, 4)
    assert default_backward((9, 0), 64, torch.float32) == BackwardConfig(16, 16, 16, 16, 1, 4)


def test_estimate_reproduces_the_h100_out_of_resource_reports() -> None:
    """bf16, head_dim 64, PyTorch's sm90 forward tile, one fp32 table (245760 B required) and two
    fp32 tables (kerple_bias_wht: 376832 B), as Triton reported them on an H100."""
    default = ForwardConfig(128, 128, 3, 4)
    assert forward_shared_memory(default, 64, itemsize=2, gathered_bytes=4) == 245760
    assert forward_shared_memory(default, 64, itemsize=2, gathered_bytes=8) == 376832
    assert forward_shared_memory(default, 64, itemsize=2, gathered_bytes=0) <= H100.shared_memory_per_block


@pytest.mark.parametrize("gathered", [0, 2, 4, 8])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("limits", [H100, A10, DeviceLimits("A100", (8, 0), 166912), DeviceLimits("B200", (10, 0), 232448)])
def test_chosen_configs_fit_and_are_valid(limits: DeviceLimits, dtype: torch.dtype, head_dim: int, gathered: int) -> None:
    forward, backward = choose_configs(limits, head_dim, dtype, gathered)
    itemsize = torch.empty((), dtype=dtype).element_size()
    assert forward_shared_memory(forward, head_dim, itemsize, gathered) <= limits.shared_memory_per_block
    assert backward_shared_memory(backward, head_dim, itemsize, gathered) <= limits.shared_memory_per_block
    if gathered == 0 and dtype != torch.float32 and head_dim == 64 and limits is H100:
        assert forward == default_forward(limits.capability, head_dim, dtype)  # nothing to give up


def _valid_backward(config: BackwardConfig) -> bool:
    tiles = (config.block_m1, config.block_n1, config.block_m2, config.block_n2)
    return (all(16 <= tile <= 128 and 128 % tile == 0 for tile in tiles)
            and config.block_n1 % config.block_m1 == 0 and config.block_m2 % config.block_n2 == 0)


@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)])
def test_every_rung_is_valid_smaller_and_the_ladder_ends(capability: tuple[int, int]) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        for head_dim in (32, 64, 128, 256):
            forward, rungs = default_forward(capability, head_dim, dtype), 0
            while (smaller := smaller_forward(forward)) is not None:
                assert forward_shared_memory(smaller, head_dim, 2, 4) < forward_shared_memory(forward, head_dim, 2, 4)
                assert 128 % smaller.block_m == 0 and 128 % smaller.block_n == 0 and smaller.block_n >= 32
                forward, rungs = smaller, rungs + 1
            assert forward.num_stages == 1 and rungs < 12
            backward, rungs = default_backward(capability, head_dim, dtype), 0
            assert _valid_backward(backward)
            while (smaller := smaller_backward(backward)) is not None:
                assert _valid_backward(smaller)
                assert backward_shared_memory(smaller, head_dim, 2, 4) < backward_shared_memory(backward, head_dim, 2, 4)
                backward, rungs = smaller, rungs + 1
            assert backward.num_stages == 1 and rungs < 12


def test_kernel_options_use_the_prefixed_names() -> None:
    options = kernel_options(ForwardConfig(128, 64, 2, 4), BackwardConfig(64, 128, 128, 64, 3, 8))
    assert options == {
        "fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_stages": 2, "fwd_num_warps": 4,
        "bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64,
        "bwd_num_stages": 3, "bwd_num_warps": 8, "FORCE_USE_FLEX_ATTENTION": True,
    }


def _out_of_resource(name: str = "triton_tem_fused_flex_attention_0", required: int = 245760) -> Exception:
    inner = RuntimeError(f"No valid triton configs. OutOfMemoryError: out of resource: {name} "
                         f"Required: {required} Hardware limit: 232448")
    return BackendCompilerFailed(lambda *args: None, InductorError(inner, None), None)


def test_out_of_resource_is_recognised_through_the_exception_chain() -> None:
    assert is_out_of_resource(_out_of_resource())
    try:
        raise ValueError("while compiling") from RuntimeError("No valid triton configs. OutOfResources")
    except ValueError as error:
        assert is_out_of_resource(error)
    assert not is_out_of_resource(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_resource(ValueError("Q and KV block size must be divisible"))


class _FailingBackward(torch.autograd.Function):
    """Identity on ``output`` (saving its inputs, as FlexAttention does) whose backward raises when
    the backward options are too large."""

    @staticmethod
    def forward(ctx, query, key, value, output, required):  # type: ignore[no-untyped-def,override]
        ctx.required = required  # None: the backward compiles
        ctx.save_for_backward(query, key, value)
        return output.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        if ctx.required is not None:
            raise _out_of_resource("triton_tem_fused_flex_attention_backward_1", ctx.required)
        return tuple(torch.zeros_like(saved) for saved in ctx.saved_tensors) + (None, None)


class FakeCompiled:
    """Stands for ``torch.compile(flex_attention)`` on a GPU with little shared memory: options
    whose forward ``BLOCK_N`` exceeds ``max_forward_n`` (backward ``BLOCK_N1`` exceeds
    ``max_backward_n1``) fail as Inductor fails; the output is the unfused FlexAttention's."""

    def __init__(self, max_forward_n: int, max_backward_n1: int) -> None:
        self.max_forward_n, self.max_backward_n1 = max_forward_n, max_backward_n1
        self.calls: list[dict] = []

    def __call__(self, query, key, value, score_mod=None, block_mask=None, kernel_options=None):  # type: ignore[no-untyped-def]
        options = self.calls.append(dict(kernel_options)) or kernel_options
        size, itemsize = query.shape[-1], query.element_size()  # the bytes Triton would report, roughly
        if options["fwd_BLOCK_N"] > self.max_forward_n:
            forward = ForwardConfig(options["fwd_BLOCK_M"], options["fwd_BLOCK_N"], options["fwd_num_stages"], 4)
            raise _out_of_resource(required=forward_shared_memory(forward, size, itemsize, itemsize))
        with torch.no_grad():
            output = flex_attention(query.detach(), key.detach(), value.detach(), score_mod=score_mod,
                                    block_mask=block_mask)
        backward = BackwardConfig(options["bwd_BLOCK_M1"], options["bwd_BLOCK_N1"], options["bwd_BLOCK_M2"],
                                  options["bwd_BLOCK_N2"], options["bwd_num_stages"], 4)
        fails = options["bwd_BLOCK_N1"] > self.max_backward_n1
        required = backward_shared_memory(backward, size, itemsize, itemsize) if fails else None
        return _FailingBackward.apply(query, key, value, output, required)


@pytest.fixture()
def fake_gpu(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A compiled kernel on 'an H100' whose compiled function is a :class:`FakeCompiled`."""
    monkeypatch.setattr(flex_base, "device_limits", lambda device: H100)
    resets: list[object] = []
    monkeypatch.setattr(torch._dynamo, "reset_code", resets.append)
    kernel = FlexAttentionKernel(compile=True)
    return kernel, resets


def _inputs(requires_grad: bool, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, 64, 16, generator=generator).to(dtype).requires_grad_(requires_grad)
                 for _ in range(3))


def _table_term(dtype: torch.dtype = torch.bfloat16):  # type: ignore[no-untyped-def]
    table = torch.linspace(0.0, -2.0, 64).expand(2, 64).contiguous()
    return distance_table_term(table, None, dtype)


def test_forward_failure_steps_down_remembers_and_logs_once(fake_gpu, caplog) -> None:  # type: ignore[no-untyped-def]
    kernel, resets = fake_gpu
    kernel._compiled_attention = fake = FakeCompiled(max_forward_n=32, max_backward_n1=128)
    query, key, value = _inputs(requires_grad=False)
    term = _table_term(torch.float32)
    with caplog.at_level(logging.INFO, logger="kerple.model.flex_options"):
        output = kernel(query, key, value, term, None)
        again = kernel(query, key, value, term, None)
    reference = FlexAttentionKernel(compile=False)(query, key, value, term, None)
    torch.testing.assert_close(output, reference)
    torch.testing.assert_close(again, reference)
    tried = [call["fwd_BLOCK_N"] for call in fake.calls]
    assert tried[-2:] == [32, 32] and all(n > 32 for n in tried[:-2])  # stepped down once, then remembered
    assert len(resets) == len(tried) - 2  # Dynamo reset after every failure
    infos = [record for record in caplog.records if record.levelno == logging.INFO]
    assert len(infos) == 1 and "BLOCK_N=32" in infos[0].getMessage() and "retries" in infos[0].getMessage()
    assert sum(record.levelno == logging.WARNING for record in caplog.records) == len(tried) - 2
    (key_text, used), = kernel.options_used().items()
    assert key_text == "NVIDIA H100 80GB HBM3 / float32 / 16 / distance_table" and "BLOCK_N=32" in used


def test_backward_failure_is_caught_before_the_training_backward(fake_gpu) -> None:  # type: ignore[no-untyped-def]
    kernel, _ = fake_gpu
    kernel._compiled_attention = fake = FakeCompiled(max_forward_n=128, max_backward_n1=32)
    query, key, value = _inputs(requires_grad=True, dtype=torch.bfloat16)  # fp32 starts at the smallest tiles
    output = kernel(query, key, value, _table_term(), None)
    output.sum().backward()  # the backward kept is one that compiles
    backward_n1 = [call["bwd_BLOCK_N1"] for call in fake.calls]
    assert backward_n1[-1] == 32 and max(backward_n1) > 32
    assert len({(call["fwd_BLOCK_N"], call["fwd_num_stages"]) for call in fake.calls}) == 1  # the forward keeps its tile
    calls = len(fake.calls)
    kernel(query, key, value, _table_term(), None).sum().backward()
    assert len(fake.calls) == calls + 1  # checked once per shape: no second copy


def test_no_backward_check_without_gradients(fake_gpu) -> None:  # type: ignore[no-untyped-def]
    kernel, _ = fake_gpu
    kernel._compiled_attention = fake = FakeCompiled(max_forward_n=128, max_backward_n1=16)
    query, key, value = _inputs(requires_grad=True)
    with torch.no_grad():
        kernel(query, key, value, _table_term(), None)
    assert len(fake.calls) == 1


def test_other_errors_and_the_bottom_rung_are_raised(fake_gpu) -> None:  # type: ignore[no-untyped-def]
    kernel, _ = fake_gpu
    query, key, value = _inputs(requires_grad=False)

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ValueError("an unrelated compile error")

    kernel._compiled_attention = broken
    with pytest.raises(ValueError, match="unrelated"):
        kernel(query, key, value, _table_term(), None)
    kernel._compiled_attention = FakeCompiled(max_forward_n=0, max_backward_n1=128)  # nothing fits
    with pytest.raises(RuntimeError, match="does not fit NVIDIA H100.*smallest tiles") as raised:
        kernel(query, key, value, _table_term(), None)
    assert is_out_of_resource(raised.value.__cause__)


def test_backward_check_inside_an_activation_checkpoint(fake_gpu) -> None:  # type: ignore[no-untyped-def]
    """The copy run for the backward check must not reach the checkpoint's saved-tensor hooks."""
    kernel, _ = fake_gpu
    kernel._compiled_attention = fake = FakeCompiled(max_forward_n=128, max_backward_n1=32)
    query, key, value = _inputs(requires_grad=True, dtype=torch.bfloat16)
    term = _table_term()
    output = torch.utils.checkpoint.checkpoint(lambda q: kernel(q, key, value, term, None), query, use_reentrant=False)
    output.float().sum().backward()
    assert query.grad is not None and fake.calls[-1]["bwd_BLOCK_N1"] == 32


def test_dilated_kernel_shares_the_options_and_the_ladder(fake_gpu) -> None:  # type: ignore[no-untyped-def]
    """RegularGPT's kernel runs on the same base: its two fp32 tables count as 8 gathered bytes."""
    from kerple.model.dilated_attention import DilatedFlexKernel, dense_dilated_attention

    kernel = DilatedFlexKernel(compile=True)
    kernel._compiled_attention = FakeCompiled(max_forward_n=64, max_backward_n1=128)
    query, key, value = _inputs(requires_grad=False)
    scalars = torch.randn(2, 3)
    output = kernel(query, key, value, scalars, 2, True)
    torch.testing.assert_close(output, dense_dilated_attention(query, key, value, scalars, 2, True), rtol=1e-5, atol=1e-5)
    assert list(kernel.options_used()) == ["NVIDIA H100 80GB HBM3 / float32 / 16 / dilated_table"]
    assert isinstance(copy.deepcopy(kernel), DilatedFlexKernel) and not copy.deepcopy(kernel).options_used()


def test_options_inside_an_enclosing_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``training.compile`` the layer's graph traces :meth:`FlexKernel.attend`: the device query
    (evaluated once, as a constant) and the option choice must trace without a graph break."""

    @torch._dynamo.assume_constant_result
    def limits(device: torch.device) -> DeviceLimits:
        import sqlite3  # stands for Triton's driver query, which Dynamo cannot trace

        sqlite3.connect(":memory:").close()
        return H100

    monkeypatch.setattr(flex_base, "device_limits", limits)
    kernel = FlexAttentionKernel(compile=True)
    query, key, value = _inputs(requires_grad=False)
    term = _table_term(torch.float32)
    traced = torch.compile(lambda q, k, v: kernel(q, k, v, term, None), fullgraph=True, backend="eager")
    with torch.no_grad():
        output = traced(query, key, value)
    torch.testing.assert_close(output, FlexAttentionKernel(compile=False)(query, key, value, term, None))
    assert list(kernel.options_used()) == ["NVIDIA H100 80GB HBM3 / float32 / 16 / distance_table"]


def _required(bytes_: int, name: str = "triton_tem_fused_flex_attention_0") -> Exception:
    inner = RuntimeError(f"No valid triton configs. OutOfMemoryError: out of resource: {name} "
                         f"Required: {bytes_} Hardware limit: 232448")
    return BackendCompilerFailed(lambda *args: None, InductorError(inner, None), None)


def test_failed_phase_follows_the_required_bytes_not_where_it_was_raised() -> None:
    """Inductor may compile both kernels in one call: the "Required: N" decides the phase."""
    from kerple.model.flex_options import OptionsLadder

    ladder, key = OptionsLadder(), ("NVIDIA H100 80GB HBM3", "bfloat16", 64, "distance_table")
    ladder.options(key, H100, torch.bfloat16, 2)
    forward, backward = ladder._rungs[key]
    needs_forward = forward_shared_memory(forward, 64, 2, 2)
    needs_backward = backward_shared_memory(backward, 64, 2, 2)
    assert needs_forward != needs_backward
    unnamed = "triton_poi_fused_0"  # a message naming no FlexAttention kernel: the sizes decide
    assert ladder.failed_phase(key, _required(needs_backward + 512, unnamed), "forward") == "backward"
    assert ladder.failed_phase(key, _required(needs_forward - 512, unnamed), "backward") == "forward"
    assert ladder.failed_phase(key, RuntimeError("No valid triton configs"), "backward") == "backward"  # no size
    # the kernel's name decides first, whatever the size
    backward_kernel = "triton_tem_fused_flex_attention_backward_1"
    assert ladder.failed_phase(key, _required(needs_forward, backward_kernel), "forward") == "backward"
    assert ladder.failed_phase(key, _required(needs_backward), "backward") == "forward"


class _BackwardOutOfResource(torch.autograd.Function):
    """Identity whose backward raises Triton's out-of-resource failure (the compiled backward failing)."""

    @staticmethod
    def forward(ctx, output, required):  # type: ignore[no-untyped-def,override]
        ctx.required = required
        return output.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        raise _required(ctx.required, "triton_tem_fused_flex_attention_backward_1")


def _configs(options: dict) -> tuple[ForwardConfig, BackwardConfig]:
    return (ForwardConfig(options["fwd_BLOCK_M"], options["fwd_BLOCK_N"], options["fwd_num_stages"], 4),
            BackwardConfig(options["bwd_BLOCK_M1"], options["bwd_BLOCK_N1"], options["bwd_BLOCK_M2"],
                           options["bwd_BLOCK_N2"], options["bwd_num_stages"], 4))


def _fake_kernel(calls: list[dict], backward_from_forward: Callable[[BackwardConfig], bool]):  # type: ignore[no-untyped-def]
    """A FlexAttention stand-in (sdpa inside) that fails as Inductor does: a forward tile too large, a
    backward that ``backward_from_forward`` says fails while the forward compiles (reported from the
    forward call), and a backward with ``BLOCK_N1 > 64`` that fails when the backward runs."""

    def attention(query, key, value, score_mod=None, block_mask=None, kernel_options=None):  # type: ignore[no-untyped-def]
        calls.append(dict(kernel_options))
        forward, backward = _configs(kernel_options)
        if forward.block_n > 64:
            raise _required(forward_shared_memory(forward, 64, 2, 0))
        if backward_from_forward(backward):
            raise _required(backward_shared_memory(backward, 64, 2, 0), "triton_tem_fused_flex_attention_backward_2")
        output = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        if backward.block_n1 > 64:
            return _BackwardOutOfResource.apply(output, backward_shared_memory(backward, 64, 2, 0))
        return output

    return attention


def test_training_compile_settles_the_options_eagerly_then_recovers_the_compiled_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``compile_flex_kernels`` under ``training.compile``: the uncompiled run lets the ladder step the
    forward (stages, then BLOCK_N) and the backward (stages, N1) down; the compiled graphs then fail once
    more, on a backward tile reported from the forward call, and ``recover`` steps the backward (the
    phase its "Required: N" names), not the forward. No parameter gradient is written."""
    from compiled_flex import _training_allowed  # lifts the CPU refusal of flex training (no kernel runs here)

    import kerple.model.decoder as decoder_module
    import kerple.model.gpt as gpt_module
    from kerple import positional
    from kerple.model import GPTModel

    eager = [False]

    @contextlib.contextmanager
    def uncompiled():  # type: ignore[no-untyped-def]
        eager[0] = True
        yield
        eager[0] = False

    monkeypatch.setattr(decoder_module, "uncompiled_layers", uncompiled)
    monkeypatch.setattr(flex_base, "device_limits", lambda device: H100)
    monkeypatch.setattr(flex_base.torch.compiler, "is_compiling", lambda: not eager[0])
    monkeypatch.setattr(flex_base.torch._dynamo, "reset", lambda: None)
    monkeypatch.setattr(flex_base.torch._dynamo, "reset_code", lambda code: None)
    monkeypatch.setattr(gpt_module, "unsupported_reason", _training_allowed(gpt_module.unsupported_reason))
    eager_calls: list[dict] = []
    compiled_calls: list[dict] = []
    monkeypatch.setattr(flex_base, "flex_attention",
                        _fake_kernel(compiled_calls, lambda backward: backward.block_m1 > 32))
    torch.manual_seed(0)
    embedding = positional.build("alibi", num_heads=2, head_dim=64, hidden_size=128, max_positions=32)
    model = GPTModel(num_layers=2, hidden_size=128, num_attention_heads=2, padded_vocab_size=32, positional=embedding,
                     attention_impl="flex").to(torch.bfloat16).train()
    model._flex._compiled_attention = _fake_kernel(eager_calls, lambda backward: backward.num_stages > 2)
    assert decoder_module.compile_flex_kernels(model, torch.zeros(2, 32, dtype=torch.long)) == 1
    forward, backward = _configs(eager_calls[-1])
    assert (forward.block_n, forward.num_stages, backward.num_stages, backward.block_n1) == (64, 2, 2, 64)
    forward, backward = _configs(compiled_calls[-1])
    assert (forward.block_m, forward.block_n, forward.num_stages) == (128, 64, 2)  # the forward kept its rung
    assert (backward.block_m1, backward.block_n1, backward.num_stages) == (32, 32, 2)  # the backward: one rung more
    assert all(p.grad is None for p in model.parameters())
