"""RegularGPT (thesis ch. 6) against oracles restated here: Eq. 6.1's pattern and values, the depth
ceil(log_C T), weight sharing and its parameter count, eager vs flex."""

from __future__ import annotations

import math

import pytest
import torch

from kerple.model.dilated_attention import (
    DilatedFlexKernel,
    adaptive_depth,
    dense_dilated_attention,
    gather_dilated_attention,
)
from kerple.model.regular import DilatedSelfAttention, RegularContext, RegularGPT


KERNELS = {
    "dense": dense_dilated_attention,
    "gather": gather_dilated_attention,
    "flex": DilatedFlexKernel(compile=False),
}


def eq_6_1_visible(m: int, n: int, chunk: int, level: int) -> bool:
    """Thesis Eq. 6.1: query m sees key n iff (m - n) / C**l is an integer in [0, C)."""
    step = chunk**level
    return (m - n) % step == 0 and 0 <= (m - n) // step < chunk


def oracle_attention(query, key, value, scalars, chunk, level, padded):
    """Eq. 6.1 with Python loops over the [pad, x_0, ...] layout: real query m attends, for every k in
    [C], to key m - k·C**l with logit q·k/sqrt(d) + r[h, k]; a key before position 0 is the pad slot
    (its own term per k) when padded, and is left out otherwise. The pad slot attends to itself."""
    batch, heads, slots, dim = query.shape
    out = torch.zeros_like(value, dtype=torch.float64)
    step = chunk**level
    for b in range(batch):
        for h in range(heads):
            out[b, h, 0] = value[b, h, 0].double()
            for m in range(slots - 1):
                terms = []  # (slot of the key, scalar)
                for k in range(chunk):
                    n = m - k * step
                    if n >= 0:
                        terms.append((n + 1, scalars[h, k]))
                    elif padded:
                        terms.append((0, scalars[h, k]))
                logits = torch.stack([
                    query[b, h, m + 1].double() @ key[b, h, slot].double() / math.sqrt(dim) + scalar.double()
                    for slot, scalar in terms
                ])
                weights = torch.softmax(logits, 0)
                out[b, h, m + 1] = sum(w * value[b, h, slot].double() for w, (slot, _) in zip(weights, terms))
    return out


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("chunk", [2, 3])
def test_kernels_match_eq_6_1_values(kernel: str, chunk: int, padded: bool) -> None:
    torch.manual_seed(chunk)
    query, key, value = torch.randn(3, 2, 3, 1 + 9, 4).unbind(0)  # the pad slot and T = 9
    scalars = torch.randn(3, chunk)
    for level in range(adaptive_depth(9, chunk) + 1):
        got = KERNELS[kernel](query, key, value, scalars, chunk**level, padded)
        want = oracle_attention(query, key, value, scalars, chunk, level, padded)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("chunk", [2, 3])
def test_each_level_attends_exactly_the_eq_6_1_pattern(chunk: int, padded: bool) -> None:
    """Output m of a layer at level l depends on input n iff Eq. 6.1 allows (m, n), and on the pad
    slot iff padded and one of its keys lies before position 0 (autograd Jacobian)."""
    torch.manual_seed(0)
    attention = DilatedSelfAttention(hidden_size=8, num_heads=2, chunk_size=chunk)
    torch.nn.init.normal_(attention.relative_scalars)
    hidden = torch.randn(1, 1 + 9, 8)
    for level in range(3):
        context = RegularContext("eager", chunk**level, padded, KERNELS["flex"])
        jacobian = torch.autograd.functional.jacobian(lambda x: attention(x, context), hidden)  # [1, 10, 8, 1, 10, 8]
        depends = jacobian[0, :, :, 0].abs().sum(dim=(1, 3)) > 0  # [1 + T, 1 + T]
        want = torch.zeros(10, 10, dtype=torch.bool)
        want[0, 0] = True
        for m in range(9):
            want[m + 1, 0] = padded and (chunk - 1) * chunk**level > m
            for n in range(9):
                want[m + 1, n + 1] = eq_6_1_visible(m, n, chunk, level)
        assert torch.equal(depends, want), f"C={chunk} level {level}"


@pytest.mark.parametrize(
    ("length", "chunk", "depth"),
    [(1, 2, 1), (2, 2, 1), (9, 2, 4), (9, 3, 2), (10, 3, 3), (27, 3, 3), (28, 3, 4), (40, 2, 6), (500, 2, 9),
     (512, 128, 2), (8192, 128, 2), (8192, 32, 3), (16385, 128, 3)],
)
def test_depth_is_ceil_log_c_t(length: int, chunk: int, depth: int) -> None:
    assert adaptive_depth(length, chunk) == depth


@pytest.mark.parametrize(("chunk", "thickness"), [(2, 1), (3, 2)])
def test_k_times_depth_layers_run_with_shared_blocks(chunk: int, thickness: int) -> None:
    """Layer l·K + k is block k with dilation C**l; lengths past training (T = 40 -> 100) run more layers."""
    model = RegularGPT(chunk_size=chunk, thickness=thickness, hidden_size=16, num_attention_heads=2, padded_vocab_size=8)
    calls: list[tuple[int, int]] = []
    for index, block in enumerate(model.layers):
        block.attention.register_forward_pre_hook(lambda module, args, k=index: calls.append((k, args[1].dilation)))
    for length in (5, 40, 100):
        calls.clear()
        model(torch.randint(0, 8, (1, length)))
        levels = math.ceil(math.log(length) / math.log(chunk) - 1e-9)
        assert calls == [(k, chunk**level) for level in range(levels) for k in range(thickness)]


@pytest.mark.parametrize(("chunk", "thickness"), [(2, 1), (3, 2), (4, 3)])
def test_parameters_are_the_k_blocks_only(chunk: int, thickness: int) -> None:
    hidden, heads, vocab = 16, 4, 11
    model = RegularGPT(chunk_size=chunk, thickness=thickness, hidden_size=hidden, num_attention_heads=heads, padded_vocab_size=vocab)
    # per block: 2 LayerNorms 4h, qkv 3h²+3h, dense h²+h, MLP 4h²+4h + 4h²+h, scalars H·C
    block = 12 * hidden**2 + 13 * hidden + heads * chunk
    # word embeddings V·h, the PAD embedding h, final LayerNorm 2h, untied head V·h
    assert sum(p.numel() for p in model.parameters()) == 2 * vocab * hidden + 3 * hidden + thickness * block
    layer_names = {name.split(".")[1] for name, _ in model.named_parameters() if name.startswith("layers.")}
    assert layer_names == {str(k) for k in range(thickness)}
    # a length beyond any training length adds no parameter, and every block is trained
    model(torch.randint(0, vocab, (2, 50))).sum().backward()
    assert all(block.attention.relative_scalars.grad.abs().sum() > 0 for block in model.layers)


def test_padding_to_a_multiple_of_c_changes_no_real_output() -> None:
    """Right padding is invisible under the causal mask while the depth is unchanged (T = 7 -> 8, C = 2)."""
    torch.manual_seed(0)
    model = RegularGPT(chunk_size=2, thickness=1, hidden_size=16, num_attention_heads=2, padded_vocab_size=8).eval()
    tokens = torch.randint(0, 8, (2, 8))
    torch.testing.assert_close(model(tokens[:, :7]), model(tokens)[:, :7], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(("chunk", "thickness", "length"), [(2, 1, 37), (3, 2, 30)])
def test_eager_and_flex_forward_agree(chunk: int, thickness: int, length: int) -> None:
    torch.manual_seed(1)
    model = RegularGPT(
        chunk_size=chunk, thickness=thickness, hidden_size=32, num_attention_heads=4, padded_vocab_size=10, flex_compile=False
    ).eval()
    for block in model.layers:  # non-zero scalars so the score_mod term is exercised
        torch.nn.init.normal_(block.attention.relative_scalars)
    tokens = torch.randint(0, 10, (2, length))
    with torch.no_grad():
        eager = model(tokens)
        model.set_attention("flex")
        flex = model(tokens)
    torch.testing.assert_close(flex, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # one torch.compile of FlexAttention: about 20 s on CPU
def test_compiled_flex_kernel_forward_on_cpu() -> None:
    """The fused (torch.compile) FlexAttention path, forward only on CPU, agrees with eager to 1e-5."""
    torch.manual_seed(2)
    query, key, value = torch.randn(3, 1, 2, 1 + 40, 8).unbind(0)
    scalars = torch.randn(2, 3)
    got = DilatedFlexKernel(compile=True)(query, key, value, scalars, 3, True)
    torch.testing.assert_close(got, dense_dilated_attention(query, key, value, scalars, 3, True), atol=1e-5, rtol=1e-5)


def test_refusals_name_the_fix() -> None:
    model = RegularGPT(chunk_size=2, thickness=1, hidden_size=8, num_attention_heads=2, padded_vocab_size=4)
    with pytest.raises(ValueError, match="no KV cache"):
        model.new_cache()
    with pytest.raises(ValueError, match="attention_window"):
        model.set_attention(window=16)
    model.set_attention("flex")
    with pytest.raises(ValueError, match="train RegularGPT with attention_impl: eager"):
        model.train()(torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.gpu
def test_flex_forward_and_backward_agree_with_eager_on_cuda() -> None:
    """On CUDA FlexAttention has a backward: logits and every gradient (the scalars r included) match eager."""
    torch.manual_seed(3)
    model = RegularGPT(chunk_size=2, thickness=2, hidden_size=64, num_attention_heads=4, padded_vocab_size=16).cuda()
    for block in model.layers:
        torch.nn.init.normal_(block.attention.relative_scalars)
    tokens = torch.randint(0, 16, (2, 300), device="cuda")
    results = {}
    for impl in ("eager", "flex"):
        model.zero_grad()
        model.set_attention(impl)
        logits = model(tokens)
        logits.square().mean().backward()
        results[impl] = (logits.detach(), [p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(results["flex"][0], results["eager"][0], atol=1e-5, rtol=1e-5)
    for flex_grad, eager_grad in zip(results["flex"][1], results["eager"][1]):
        torch.testing.assert_close(flex_grad, eager_grad, atol=1e-4, rtol=1e-4)


# Eq. 6.1 written out by hand for T = 8: row m lists, for every key n, the k = (m - n) / C**l of a
# visible pair ("." where -inf); "p" in front marks a query one of whose C keys lies before position 0
# (it reads the pad slot when padded).
HAND_MASKS = {
    (2, 0): ["p0.......", ".10......", "..10.....", "...10....", "....10...", ".....10..", "......10.", ".......10"],
    (2, 1): ["p0.......", "p.0......", ".1.0.....", "..1.0....", "...1.0...", "....1.0..", ".....1.0.", "......1.0"],
    (2, 2): ["p0.......", "p.0......", "p..0.....", "p...0....", ".1...0...", "..1...0..", "...1...0.", "....1...0"],
    (3, 1): ["p0.......", "p.0......", "p..0.....", "p1..0....", "p.1..0...", "p..1..0..", ".2..1..0.", "..2..1..0"],
}


@pytest.mark.parametrize(("chunk", "level"), list(HAND_MASKS))
def test_dense_term_and_flex_mask_match_the_hand_written_eq_6_1(chunk: int, level: int) -> None:
    from torch.nn.attention.flex_attention import create_mask

    from kerple.positional.dilated import dense_term, flex_mods

    scalars = torch.tensor([[0.5, -1.25, 2.0][:chunk]])  # one head, distinct r_k
    rows = HAND_MASKS[chunk, level]
    for padded in (True, False):
        term = dense_term(scalars, 8, chunk**level, padded)[0]  # [1 + T, 1 + T]
        flex = create_mask(flex_mods(scalars, chunk**level, padded).mask_mod, None, None, 9, 9, device="cpu")[0, 0]
        assert term[0, 0] == 0 and torch.isinf(term[0, 1:]).all() and flex[0].tolist() == [True] + [False] * 8
        for m, row in enumerate(rows):
            pad_seen = row[0] == "p" and padded
            assert torch.isfinite(term[m + 1, 0]).item() == pad_seen and flex[m + 1, 0].item() == pad_seen
            for n, mark in enumerate(row[1:]):
                assert flex[m + 1, n + 1].item() == (mark != "."), (chunk, level, m, n)
                want = float("-inf") if mark == "." else scalars[0, int(mark)].item()
                assert term[m + 1, n + 1].item() == want, (chunk, level, m, n)
    # the pad slot's logit is logsumexp of r over the absent keys: C = 3, D = 3, query 0 misses k = 1, 2,
    # query 3 misses k = 2 only
    term = dense_term(scalars, 8, 3, True)[0] if chunk == 3 else None
    if term is not None:
        torch.testing.assert_close(term[1, 0], torch.logsumexp(scalars[0, 1:], 0))
        torch.testing.assert_close(term[4, 0], scalars[0, 2])
