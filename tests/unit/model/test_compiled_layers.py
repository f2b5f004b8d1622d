"""Regional compilation (``compile: true``, one ``torch.compile`` per decoder layer): no graph break
inside a layer for any registered embedding, with the kernel it trains with on a CPU and with
FlexAttention in evaluation; compiled with Inductor on a CPU, loss and every gradient equal eager's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kerple import positional
from kerple.model import GPTModel, maybe_compile
from model_helpers import HEAD_DIM, HEADS, HIDDEN, VOCAB, tiny_model


def layer_graphs(name: str, impl: str, training: bool) -> tuple[int, int, list[str]]:
    """(graphs, graph breaks, reasons) of Dynamo tracing the first layer's forward, with autograd
    when ``training`` (Dynamo then also traces the backward of every custom autograd function)."""
    model = tiny_model(name, impl=impl).train(training)
    tokens = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    with torch.set_grad_enabled(training):
        context = model.attention_context(16, tokens.device)
        hidden = model.embedding(tokens, context.q_positions, model.positional)
        explained = torch._dynamo.explain(model.layers[0])(hidden, context)
    return explained.graph_count, explained.graph_break_count, [str(b.reason)[:200] for b in explained.break_reasons]


@pytest.mark.parametrize("name", positional.names())
def test_a_layer_is_one_graph_for_every_embedding(name: str) -> None:
    trained_with = tiny_model(name).gradient_attention_impl("cpu", 16)
    graphs, breaks, reasons = layer_graphs(name, trained_with, training=True)
    assert (graphs, breaks) == (1, 0), (trained_with, reasons)
    graphs, breaks, reasons = layer_graphs(name, "flex", training=False)
    assert (graphs, breaks) == (1, 0), ("flex", reasons)


@pytest.mark.slow  # inductor compiles C++ for the layers: 15-30 s each on 2 cold cores
@pytest.mark.parametrize("name", ["kerple_log", "cable"])
def test_inductor_layers_equal_eager_and_share_one_graph(name: str, one_thread) -> None:
    """kerple_log: a learnable bias through the fused CPU attention's custom backward; CABLE: a
    term from each layer's own parameters (the layer index must not make one graph per layer)."""
    from torch._dynamo.utils import counters

    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(tokens, -1, dims=1)
    eager, compiled = four_layers(name), four_layers(name)
    torch._dynamo.reset()
    counters.clear()
    maybe_compile(compiled, SimpleNamespace(training=SimpleNamespace(compile=True)))
    for model in (eager, compiled):
        model(tokens, labels=labels).backward()
    torch.testing.assert_close(compiled(tokens, labels=labels), eager(tokens, labels=labels), rtol=1e-5, atol=1e-6)
    for (key, want), (_, got) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6, msg=key)
    # four layers in at most two graphs (one recompile), and the loss's chunk terms in one
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])


@pytest.mark.slow  # inductor in bf16: about 20 s on 2 cold cores
def test_compiled_layers_through_pytorchs_sdpa_give_the_mask_eagers_gradient_in_bf16(
        one_thread, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path CUDA trains a bias with: PyTorch's own sdpa, its mask's gradient through autograd (here
    instead of the fused CPU kernel), in bf16, compiled with Inductor over two steps. On a CPU it keeps
    kerple_log's gradient; on an H200 it did not (the CUDA test below)."""
    from kerple.model import sdpa_cpu

    monkeypatch.setattr(sdpa_cpu, "supported", lambda query, dropout_p: False)
    eager, compiled = (four_layers("kerple_log").bfloat16() for _ in range(2))
    torch._dynamo.reset()
    maybe_compile(compiled, SimpleNamespace(training=SimpleNamespace(compile=True)))
    for step in range(2):  # the second step reuses the graphs
        tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(step))
        for model in (eager, compiled):
            model.zero_grad()
            model(tokens, labels=torch.roll(tokens, -1, dims=1)).backward()
        want, got = ({key: getattr(m.positional, key).grad for key in ("bias_p", "bias_a")} for m in (eager, compiled))
        assert_gradients_match(want, got, f"step {step}")


def recording_backend(seen: dict[str, set[str]], inductor_graph: bool) -> object:
    """A ``torch.compile`` backend that runs AOTAutograd's forward and backward graphs as they are
    and records their attention kernels in ``seen["forward"]`` / ``seen["backward"]`` (``math`` for a
    graph without one: the attention decomposed into matmuls and a softmax); with ``inductor_graph``
    it traces with Inductor's decompositions, the graph Inductor would lower."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.decomposition import select_decomp_table

    def recorder(kind: str):  # type: ignore[no-untyped-def]
        def compile_graph(graph_module: torch.fx.GraphModule, example_inputs: list):  # type: ignore[no-untyped-def]
            kernels = {str(node.target) for node in graph_module.graph.nodes
                       if node.op == "call_function" and "attention" in str(node.target)}
            seen.setdefault(kind, set()).update(kernels or {"math"})
            return make_boxed_func(graph_module.forward)
        return compile_graph

    return aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"),
                        decompositions=select_decomp_table() if inductor_graph else None)


def compiled_bias_gradients(backend: object, device: str, impl: str = "sdpa") -> tuple[dict, dict]:
    """kerple_log's (eager, compiled) positional gradients after one forward and backward in bf16,
    the layers compiled with ``backend`` (:func:`~kerple.model.maybe_compile`)."""
    tokens = torch.randint(0, VOCAB, (4, 256), generator=torch.Generator().manual_seed(1)).to(device)
    eager, compiled = (four_layers("kerple_log").to(device).bfloat16() for _ in range(2))
    for model in (eager, compiled):
        model.set_attention(impl)
    torch._dynamo.reset()
    maybe_compile(compiled, SimpleNamespace(training=SimpleNamespace(compile=True)), backend=backend)
    for model in (eager, compiled):
        model(tokens, labels=torch.roll(tokens, -1, dims=1)).backward()
    return tuple({key: getattr(m.positional, key).grad for key in ("bias_p", "bias_a")} for m in (eager, compiled))


def assert_gradients_match(want: dict, got: dict, where: object = "") -> None:
    """Each compiled gradient exists, is not zero everywhere, and equals eager's within bf16's error."""
    for key in want:
        assert got[key] is not None and bool(got[key].ne(0).any()), f"no gradient for {key}: {where}"
        torch.testing.assert_close(got[key].float(), want[key].float(), rtol=0.05,
                                   atol=0.05 * float(want[key].abs().max()), msg=f"{key}: {where}")


@pytest.mark.parametrize("detached", [False, True], ids=["mask", "detached-mask"])
def test_the_recording_backend_names_the_kernel_that_keeps_or_drops_the_gradient(
        detached: bool, one_thread, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool of the CUDA test below, on a CPU, with PyTorch's sdpa: a mask that needs a gradient
    goes to its math kernel and keeps the gradient; a detached one goes to the fused CPU kernel,
    and kerple_log's parameters get zeros (the failure seen on an H200)."""
    from kerple.model import attention, sdpa_cpu

    monkeypatch.setattr(sdpa_cpu, "supported", lambda query, dropout_p: False)
    if detached:
        mask = attention.AttentionContext.sdpa_mask
        monkeypatch.setattr(attention.AttentionContext, "sdpa_mask", lambda self, dtype: mask(self, dtype).detach())
    seen: dict[str, set[str]] = {}
    want, got = compiled_bias_gradients(recording_backend(seen, inductor_graph=False), "cpu")
    if detached:
        assert seen == {"forward": {"aten._scaled_dot_product_flash_attention_for_cpu.default"},
                        "backward": {"aten._scaled_dot_product_flash_attention_for_cpu_backward.default"}}, seen
        assert all(not bool(grad.ne(0).any()) for grad in got.values())
        return
    assert seen == {"forward": {"math"}, "backward": {"math"}}, seen
    assert_gradients_match(want, got)


@pytest.mark.gpu
@pytest.mark.parametrize("guarded", [True, False], ids=["mask-gradient-kernels", "any-kernel"])
@pytest.mark.parametrize("inductor_graph", [False, True], ids=["aot-graph", "inductor-graph"])
def test_the_compiled_kernel_of_a_learnable_bias_returns_its_gradient_on_cuda(
        guarded: bool, inductor_graph: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Names the attention kernels the compiled graphs of a learnable bias through sdpa use on CUDA,
    and the one eager sdpa would choose, so a failure says which kernel dropped the gradient; with the
    mask's gradient kernels only (what the model does) and with any kernel (the model before it kept
    cuDNN away from a mask that needs a gradient)."""
    from torch.nn.attention import SDPBackend

    from kerple.model import attention

    if not guarded:
        monkeypatch.setattr(attention, "MASK_GRADIENT_KERNELS", [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                                                  SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    query = torch.randn(4, HEADS, 256, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    mask = torch.randn(1, HEADS, 256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager_choice = SDPBackend(torch._fused_sdp_choice(query.requires_grad_(), query, query, mask)).name
    seen: dict[str, set[str]] = {}
    want, got = compiled_bias_gradients(recording_backend(seen, inductor_graph), "cuda")
    assert_gradients_match(want, got, f"eager sdpa would choose {eager_choice}; the compiled graphs use {seen}")


def four_layers(name: str) -> GPTModel:
    """The tiny model's sizes with four layers, so one graph per layer would show."""
    torch.manual_seed(0)
    embedding = positional.build(name, num_heads=HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN, max_positions=128,
                                 num_layers=4)
    return GPTModel(num_layers=4, hidden_size=HIDDEN, num_attention_heads=HEADS, padded_vocab_size=VOCAB,
                    positional=embedding, attention_impl="sdpa", flex_compile=False)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["sdpa", "flex"])
def test_compiled_layers_give_a_learnable_bias_eagers_gradient_on_cuda(impl: str) -> None:
    """On an H200 (torch 2.11) kerple_log's fp32 masters did not move over 11 steps of compiled layers
    through sdpa (docs/gpu-report.md), while eager sdpa and compiled flex trained them; ``auto``
    avoids that path since, and the model keeps cuDNN's attention away from a mask that needs a
    gradient. One forward and backward in bf16 through Inductor, the compiled model's positional
    gradients against eager's: passing with sdpa, the path is fit to train again."""
    assert_gradients_match(*compiled_bias_gradients("inductor", "cuda", impl), f"{impl} in compiled layers")
