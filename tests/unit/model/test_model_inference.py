"""Evaluation/inference helpers: chunked loss, KV-cached decoding, windowed cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kerple.model import KVCache
from model_helpers import VOCAB, tiny_model


def _tokens(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("chunk_size", [1, 7, 64])
def test_chunked_loss_equals_full_cross_entropy(chunk_size: int) -> None:
    model = tiny_model("kerple_log").eval()
    tokens, labels = _tokens(2, 30), _tokens(2, 30, seed=1)
    labels[0, 3] = -100
    with torch.no_grad():
        logits = model(tokens)
        full = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none", ignore_index=-100).view(2, 30)
        chunked = model.chunked_loss(tokens, labels, chunk_size=chunk_size)
    assert chunked.shape == (2, 30) and chunked.dtype == torch.float32
    assert chunked[0, 3] == 0
    torch.testing.assert_close(chunked, full, rtol=1e-6, atol=1e-6)


def test_chunked_loss_gradients_equal_full_loss_gradients() -> None:
    tokens, labels = _tokens(2, 20), _tokens(2, 20, seed=1)
    full_model, chunk_model = tiny_model("alibi"), tiny_model("alibi")
    F.cross_entropy(full_model(tokens).flatten(0, 1), labels.flatten()).backward()
    chunk_model.chunked_loss(tokens, labels, chunk_size=6).mean().backward()
    for (key, full), (_, chunk) in zip(full_model.named_parameters(), chunk_model.named_parameters()):
        torch.testing.assert_close(chunk.grad, full.grad, rtol=1e-5, atol=1e-6, msg=key)


def test_hidden_states_feed_the_head() -> None:
    model = tiny_model("rotary").eval()
    tokens = _tokens(1, 10)
    with torch.no_grad():
        hidden = model.hidden_states(tokens)
        torch.testing.assert_close(hidden @ model.lm_head_weight.T, model(tokens))
    assert hidden.shape == (1, 10, 32)


def _decode(model, tokens: torch.Tensor, cache: KVCache, steps: list[int]) -> torch.Tensor:
    outputs, start = [], 0
    for size in steps:
        outputs.append(model(tokens[:, start : start + size], cache=cache))
        start += size
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
@pytest.mark.parametrize("name", ["kerple_log", "rotary", "learned", "kerple_bias_wht", "rpe", "fire", "cable", "xpos"])
def test_kv_cache_matches_full_forward(name: str, impl: str) -> None:
    if impl == "sdpa" and name == "kerple_bias_wht":
        pytest.skip("weight kernel cannot run under sdpa")
    model = tiny_model(name, impl=impl).eval()
    tokens = _tokens(2, 24)
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        incremental = _decode(model, tokens, cache, [10, 1, 1, 5, 1, 6])
    assert cache.position == 24 and cache.cached_length == 24
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-5)


def test_cache_window_at_least_length_is_full_attention() -> None:
    model = tiny_model("alibi").eval()
    tokens = _tokens(1, 20)
    with torch.no_grad():
        full = model(tokens)
        windowed = _decode(model, tokens, model.new_cache(window=20), [1] * 20)
    torch.testing.assert_close(windowed, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["kerple_log", "rotary", "sandwich", "fire", "cable"])
@pytest.mark.parametrize("steps", [[1] * 24, [8, 8, 8], [5, 1, 1, 1, 16]])
def test_cache_window_equals_attention_window(name: str, steps: list[int]) -> None:
    window = 6
    model = tiny_model(name).eval()
    tokens = _tokens(2, 24)
    with torch.no_grad():
        model.set_attention(window=window)
        expected = model(tokens)
        model.set_attention(window=None)
        cache = model.new_cache(window=window)
        decoded = _decode(model, tokens, cache, steps)
    assert cache.cached_length == window and cache.position == 24
    torch.testing.assert_close(decoded, expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(model(tokens), expected, atol=1e-4)


def test_windowed_cache_reads_tables_of_window_length() -> None:
    """One new query row reads a distance table of cached + 1 entries, not the full length."""
    model = tiny_model("kerple_log").eval()
    lengths: list[int] = []
    original = model.positional.distance_tables

    def spy(k_len: int, device=None):
        lengths.append(k_len)
        return original(k_len, device=device)

    model.positional.distance_tables = spy
    with torch.no_grad():
        _decode(model, _tokens(1, 12), model.new_cache(window=4), [1] * 12)
    assert lengths == [1, 2, 3, 4] + [5] * 8
