"""KV-cached generation equals full recomputation; the windowed cache equals windowed attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kerple.config import load_config
from kerple.inference import GenerationError, generate, sample_next, windowed_cache_losses
from kerple.model import build_model

VOCAB = 64


def tiny(pos_emb: str, seed: int = 0, **overrides):
    values = {
        "num_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "vocab_size": VOCAB,
        "make_vocab_size_divisible_by": 8,
        "seq_length": 64,
        "pos_emb": pos_emb,
        "attention_impl": "eager",
    }
    values.update(overrides)
    torch.manual_seed(seed)
    model = build_model(load_config([], values), flex_compile=False).eval()
    with torch.no_grad():  # larger weights make greedy choices decisive
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(8.0)
    return model


PROMPT = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
EMBEDDINGS = ["kerple_log", "kerple_bias_wht", "rotary", "alibi", "rpe", "learned", "sandwich"]


@pytest.mark.parametrize("pos_emb", EMBEDDINGS)
def test_cached_greedy_equals_full_recomputation(pos_emb):
    model = tiny(pos_emb)
    cached = generate(model, PROMPT, 20, temperature=0.0)
    full = generate(model, PROMPT, 20, temperature=0.0, use_cache=False)
    assert torch.equal(cached, full)
    assert cached.shape == (2, 25)


@pytest.mark.parametrize("pos_emb", ["kerple_log", "rotary", "rpe"])
def test_incremental_logits_match_the_full_forward(pos_emb):
    model = tiny(pos_emb)
    tokens = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :7], cache=cache)]
        steps += [model(tokens[:, i : i + 1], cache=cache) for i in range(7, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pos_emb", ["alibi", "kerple_log"])
def test_windowed_cache_generation_equals_windowed_attention(pos_emb):
    model = tiny(pos_emb)
    cached = generate(model, PROMPT, 24, cache_window=6)
    full = generate(model, PROMPT, 24, cache_window=6, use_cache=False)
    assert torch.equal(cached, full)
    assert model.attention_window is None  # restored after the recomputation path


@pytest.mark.parametrize("pos_emb", ["alibi", "kerple_log", "rotary"])
def test_windowed_losses_equal_full_attention_when_window_covers_the_sequence(pos_emb):
    model = tiny(pos_emb)
    tokens = torch.randint(0, VOCAB, (2, 41), generator=torch.Generator().manual_seed(5))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        reference = F.cross_entropy(model(inputs).transpose(1, 2), labels, reduction="none")
    for window, chunk in ((40, None), (64, 7)):
        losses = windowed_cache_losses(model, inputs, window, labels, chunk_size=chunk)
        torch.testing.assert_close(losses, reference, rtol=1e-5, atol=1e-5)
    assert windowed_cache_losses(model, tokens, 40).shape == (2, 40)


def test_small_window_equals_attention_window_and_differs_from_full():
    model = tiny("alibi")
    tokens = torch.randint(0, VOCAB, (1, 33), generator=torch.Generator().manual_seed(6))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    losses = windowed_cache_losses(model, inputs, 8, labels, chunk_size=5)
    with torch.no_grad():
        full = F.cross_entropy(model(inputs).transpose(1, 2), labels, reduction="none")
        model.set_attention(window=8)
        windowed = F.cross_entropy(model(inputs).transpose(1, 2), labels, reduction="none")
    torch.testing.assert_close(losses, windowed, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(losses[:, 8:], full[:, 8:], atol=1e-4)


def test_sampling_controls():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 4.9]])
    assert sample_next(logits).tolist() == [1, 0]
    gen = torch.Generator().manual_seed(0)
    assert sample_next(logits, temperature=1.0, top_k=1, generator=gen).tolist() == [1, 0]
    assert sample_next(logits, temperature=1.0, top_p=1e-3, generator=gen).tolist() == [1, 0]
    draws = torch.stack([sample_next(logits, temperature=1.0, top_k=2, generator=gen) for _ in range(200)])
    assert set(draws[:, 0].tolist()) == {1, 3} and set(draws[:, 1].tolist()) == {0, 3}
    again = [sample_next(logits, temperature=1.0, generator=torch.Generator().manual_seed(9)).tolist() for _ in range(2)]
    assert again[0] == again[1]


def test_vocab_limit_and_learned_table_limit():
    model = tiny("rotary")
    out = generate(model, PROMPT, 10, temperature=1.0, vocab_limit=3, generator=torch.Generator().manual_seed(0))
    assert int(out[:, 5:].max()) < 3
    with pytest.raises(GenerationError, match="learned position table"):
        generate(tiny("learned"), PROMPT, 100)
