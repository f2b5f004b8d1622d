"""The LM head fused with the cross entropy against the unfused reference: full logits, ``.float()``,
``F.cross_entropy`` (what the trainer computed before), in loss and in every gradient; ignored
labels; no fp32 logits of more than one chunk at a time; the model's ``forward(labels=...)``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from kerple.model.lm_loss import chunk_tokens_for, linear_cross_entropy
from model_helpers import VOCAB, tiny_model


def reference(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The unfused loss: ``[N, V]`` logits in the inputs' dtype, upcast to fp32, mean cross entropy."""
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)


def inputs(dtype: torch.dtype, tokens: int = 150, hidden: int = 24, vocab: int = 300, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(tokens, hidden, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=generator) * 0.3).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=generator)
    labels[::5] = -100
    return states, weight, labels


def loss_and_grads(function, states, weight, labels, scale: float = 1.0):
    loss = function(states, weight, labels)
    grads = torch.autograd.grad(loss * scale, (states, weight))
    return loss, grads


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_fp32_equals_the_unfused_loss_and_gradients(chunk: int) -> None:
    states, weight, labels = inputs(torch.float32)
    expected, (grad_states, grad_weight) = loss_and_grads(reference, states, weight, labels, scale=2.5)
    fused = lambda s, w, y: linear_cross_entropy(s, w, y, chunk_tokens=chunk)  # noqa: E731
    loss, (fused_states, fused_weight) = loss_and_grads(fused, states, weight, labels, scale=2.5)
    assert loss.dtype == torch.float32 and loss.shape == ()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fused_states, grad_states, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(fused_weight, grad_weight, rtol=1e-5, atol=1e-7)
    assert fused_states[::5].abs().max() == 0  # ignored positions get no gradient


def test_bf16_within_bf16_rounding_of_the_unfused_loss() -> None:
    """bf16 inputs: logits in bf16, softmax in fp32 on both sides; the gradients differ by bf16
    rounding (the weight's gradient is summed over chunks in fp32 instead of one bf16 product)."""
    states, weight, labels = inputs(torch.bfloat16, tokens=200)
    expected, (grad_states, grad_weight) = loss_and_grads(reference, states, weight, labels)
    fused = lambda s, w, y: linear_cross_entropy(s, w, y, chunk_tokens=48)  # noqa: E731
    loss, (fused_states, fused_weight) = loss_and_grads(fused, states, weight, labels)
    assert fused_states.dtype == fused_weight.dtype == torch.bfloat16
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=1e-3)
    for fused_grad, grad in ((fused_states, grad_states), (fused_weight, grad_weight)):
        error = (fused_grad.float() - grad.float()).abs().max() / grad.float().abs().max()
        assert error < 2**-7, error


def test_one_input_without_gradient_and_no_autograd() -> None:
    states, weight, labels = inputs(torch.float32)
    frozen = weight.detach()
    expected = torch.autograd.grad(reference(states, frozen, labels), states)[0]
    torch.testing.assert_close(torch.autograd.grad(linear_cross_entropy(states, frozen, labels, chunk_tokens=16),
                                                   states)[0], expected, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        loss = linear_cross_entropy(states, weight, labels, chunk_tokens=16)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, reference(states, weight, labels).detach(), rtol=1e-6, atol=1e-6)


def test_every_label_ignored_gives_zero_not_nan() -> None:
    states, weight, labels = inputs(torch.float32)
    loss = linear_cross_entropy(states, weight, torch.full_like(labels, -100))
    assert loss.item() == 0.0


def test_no_allocation_holds_more_than_one_chunk_of_logits() -> None:
    """Forward and backward at 512 tokens x 2,000 words with chunks of 64: the largest single
    allocation is one chunk's fp32 logits, an eighth of what the unfused loss allocates."""
    tokens, vocab, chunk = 512, 2000, 64
    states, weight, labels = inputs(torch.float32, tokens=tokens, hidden=16, vocab=vocab)

    def largest_allocation(function) -> int:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            torch.autograd.grad(function(states, weight, labels), (states, weight))
        return max(event.cpu_memory_usage for event in prof.events())

    fused = largest_allocation(lambda s, w, y: linear_cross_entropy(s, w, y, chunk_tokens=chunk))
    unfused = largest_allocation(reference)
    assert unfused >= tokens * vocab * 4
    assert fused <= chunk * vocab * 4 < unfused / 7


def test_chunks_are_equal_and_within_the_budget() -> None:
    assert chunk_tokens_for(16384, 50304) == 1261  # 256 MiB / (4 B x 50,304) = 1,334 at most: 13 chunks
    assert chunk_tokens_for(16384, 50304, budget=2**30) == 4096  # 5,336 at most: 4 chunks
    assert chunk_tokens_for(512, 50304) == 512
    assert chunk_tokens_for(100, 50304, budget=2**20) == 5 and chunk_tokens_for(3, 10**9) == 1
    assert chunk_tokens_for(11, 10, budget=4 * 10 * 4) == 4  # at most 4: 3 chunks, of 4, 4 and 3


def test_model_forward_with_labels_is_the_mean_cross_entropy_of_its_logits() -> None:
    fused_model, plain_model = tiny_model("kerple_log"), tiny_model("kerple_log")
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    labels = torch.roll(tokens, -1, dims=1)
    labels[:, -1] = -100
    fused = fused_model(tokens, labels=labels)
    plain = F.cross_entropy(plain_model(tokens).float().flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)
    fused.backward()
    plain.backward()
    for (name, fused_param), (_, plain_param) in zip(fused_model.named_parameters(), plain_model.named_parameters()):
        torch.testing.assert_close(fused_param.grad, plain_param.grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_chunk_terms_equal_the_unfused_loss(dtype: torch.dtype, one_thread) -> None:
    """``compiled=True`` (what ``compile: true`` turns on): the same loss and gradients through Inductor,
    here on a CPU, against the unfused reference; chunks of 48 over 150 tokens (a last chunk of 6)."""
    states, weight, labels = inputs(dtype)
    expected, (grad_states, grad_weight) = loss_and_grads(reference, states, weight, labels, scale=2.5)
    fused = lambda s, w, y: linear_cross_entropy(s, w, y, chunk_tokens=48, compiled=True)  # noqa: E731
    loss, (fused_states, fused_weight) = loss_and_grads(fused, states, weight, labels, scale=2.5)
    tolerance = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(loss, expected, rtol=tolerance, atol=tolerance)
    for fused_grad, grad in ((fused_states, grad_states), (fused_weight, grad_weight)):
        assert fused_grad.dtype == dtype
        error = (fused_grad.float() - grad.float()).abs().max() / grad.float().abs().max()
        assert error < tolerance, error


def test_the_target_entry_is_formed_before_rounding() -> None:
    """A confident bf16 chunk: the target's probability near 1, so its gradient (p - 1)·share is small;
    rounding p·share and share apart first would leave 0 (p rounds to 1 in bf16)."""
    from kerple.model.lm_loss import chunk_terms

    logits = torch.tensor([[12.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    share = torch.tensor([[0.37]])
    _, grad = chunk_terms(logits.clone(), torch.tensor([[0]]), share)
    exact = (torch.softmax(logits.double(), 1)[0, 0] - 1) * 0.37
    assert abs(grad[0, 0].double() - exact) <= abs(exact) * 0.05  # fp32's lse - logit leaves ~2% here


def peak_allocated(function) -> int:
    """The most bytes that allocations made inside ``function()`` held at once (CPU allocator events
    in time order, from the profiler's record of each allocation and free)."""
    from torch._C._profiler import _EventType

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        function()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack += event.children
        if event.typed[0] == _EventType.Allocation:
            events.append(event)
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_time_ns):
        live += event.typed[1].alloc_size  # negative for a free
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_chunk_holds_its_fp32_logits_and_the_rounded_gradient_at_most(dtype: torch.dtype) -> None:
    """One chunk's terms, 256 x 4,096 logits: at most 4 bytes per logit for the fp32 copy and, in
    bf16, 2 for the rounded gradient (the module docstring's 6 bytes). ``torch.logsumexp`` would add
    a second fp32 buffer, and a bf16 ``scatter_`` on a CPU an fp32 copy of the chunk."""
    from kerple.model.lm_loss import chunk_terms

    chunk, vocab = 256, 4096
    logits = torch.randn(chunk, vocab).to(dtype)
    target = torch.randint(0, vocab, (chunk, 1), generator=torch.Generator().manual_seed(0))
    share = torch.full((chunk, 1), 1 / chunk)
    peak = peak_allocated(lambda: chunk_terms(logits.clone() if dtype == torch.float32 else logits, target, share))
    per_logit = 6 if dtype == torch.bfloat16 else 4
    assert peak <= per_logit * chunk * vocab + 2**16, peak / (chunk * vocab)


def test_the_fused_loss_holds_one_chunk_of_logits_at_a_time() -> None:
    """bf16, 1,024 tokens in chunks of 256 over 4,096 words, h 16: the loss's own allocations peak at
    one chunk's 6 bytes per logit, plus the weight's fp32 gradient and a chunk's ``[h, V]`` product
    (and on a CPU the fp32 copy of that product that ``+=`` makes) and the hidden states' gradient.
    A chunk's gradient still alive while the next chunk's logits are made would add 2 bytes per logit."""
    tokens, chunk, vocab, hidden = 1024, 256, 4096, 16
    states, weight, labels = inputs(torch.bfloat16, tokens=tokens, hidden=hidden, vocab=vocab)
    peak = peak_allocated(lambda: linear_cross_entropy(states, weight, labels, chunk_tokens=chunk))
    assert peak <= 6 * chunk * vocab + (4 + 2 + 4) * hidden * vocab + 4 * tokens * hidden + 2**16, peak


def test_validation_holds_one_chunks_fp32_logits_and_its_16_bit_ones_at_most() -> None:
    """Without autograd (a validation's forward), bf16, chunks of 256 over 4,096 words: the bf16
    product and its fp32 copy, 6 bytes per logit, then the copy alone, overwritten in place
    (``torch.logsumexp`` allocated another 4)."""
    tokens, chunk, vocab = 1024, 256, 4096
    states, weight, labels = inputs(torch.bfloat16, tokens=tokens, hidden=16, vocab=vocab)
    with torch.no_grad():
        peak = peak_allocated(lambda: linear_cross_entropy(states, weight, labels, chunk_tokens=chunk))
        torch.testing.assert_close(linear_cross_entropy(states, weight, labels, chunk_tokens=chunk),
                                   reference(states, weight, labels), rtol=1e-3, atol=1e-3)
    assert peak <= 6 * chunk * vocab + 16 * tokens + 2**16, peak / (chunk * vocab)
