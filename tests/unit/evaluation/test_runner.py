"""The evaluation loop against hand-computed losses, with stand-in loss functions and a tiny model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from kerple.evaluation.protocols import last_token, nonoverlap, sliding
from kerple.evaluation.runner import (
    EvaluationError,
    estimate_forward_bytes,
    evaluate_plan,
    fit_batch_size,
    model_loss_fn,
    scored_token_count,
)

STREAM = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9], dtype=np.int64)


def label_plus_position(tokens: torch.Tensor, labels: torch.Tensor, first: int) -> torch.Tensor:
    """loss = label / 100 + position / 10: every number below follows by hand."""
    positions = torch.arange(first, labels.shape[1], dtype=torch.float64)[None, :]
    return labels[:, first:].double() / 100 + positions / 10


def test_nonoverlap_loss_and_per_position_by_hand() -> None:
    (plan,) = nonoverlap(len(STREAM), [4])  # windows at 0, 4, 8; labels 1 4 1 5 | 9 2 6 5 | 3 5 8 9
    result = evaluate_plan(label_plus_position, STREAM, plan, batch_size=2, per_position=True, progress=False)
    assert result.num_windows == 3 and result.scored_tokens == 12
    assert result.loss == pytest.approx(58 / 12 / 100 + 0.15)
    assert result.ppl == pytest.approx(math.exp(result.loss))
    expected = [13 / 300, 11 / 300 + 0.1, 15 / 300 + 0.2, 19 / 300 + 0.3]
    assert result.per_position_loss == pytest.approx(expected)
    # equal counts at every position: the per-position means average to the overall loss
    assert sum(result.per_position_loss) / 4 == pytest.approx(result.loss)


def test_sliding_scores_only_the_last_stride() -> None:
    (plan,) = sliding(len(STREAM), [4], stride=2)  # T = 12: windows at 0, 2, 4, 6, 8
    result = evaluate_plan(label_plus_position, STREAM, plan, batch_size=3, per_position=True, progress=False)
    # window 0 scores labels 1 4 1 5 at positions 0-3; later windows score positions 2, 3
    labels = [1, 4, 1, 5] + [9, 2] + [6, 5] + [3, 5] + [8, 9]
    positions = [0, 1, 2, 3] + [2, 3] * 4
    assert result.scored_tokens == 12
    assert result.loss == pytest.approx(sum(labels) / 1200 + sum(positions) / 120)
    assert result.per_position_loss[0] == pytest.approx(0.01)
    assert result.per_position_loss[2] == pytest.approx((1 + 9 + 6 + 3 + 8) / 500 + 0.2)


def test_last_token_scores_the_same_targets_at_every_length() -> None:
    def label_only(tokens: torch.Tensor, labels: torch.Tensor, first: int) -> torch.Tensor:
        return labels[:, first:].double() / 100

    stream = np.arange(100, 140, dtype=np.int64)  # token value = 100 + stream index
    plans = last_token(len(stream), [2, 4, 8])  # targets at stream indices 7, 15, 23, 31, 39
    losses = {plan.length: evaluate_plan(label_only, stream, plan, progress=False).loss for plan in plans}
    expected = (107 + 115 + 123 + 131 + 139) / 5 / 100
    assert losses == {2: pytest.approx(expected), 4: pytest.approx(expected), 8: pytest.approx(expected)}


class TinyCausalLM(nn.Module):
    """Embedding + one causal self-attention layer + head, enough to give position-dependent losses."""

    def __init__(self, vocab: int = 16, hidden: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.attn = nn.MultiheadAttention(hidden, 2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        mask = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).triu(1)
        x = x + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        return self.head(x)


def test_real_model_per_position_mean_and_repeatability() -> None:
    torch.manual_seed(0)
    model = TinyCausalLM().eval()
    stream = np.random.default_rng(0).integers(0, 16, size=200)
    plans = nonoverlap(len(stream), [8, 16])
    loss_fn = model_loss_fn(model)
    first = [evaluate_plan(loss_fn, stream, p, batch_size=4, per_position=True, progress=False) for p in plans]
    again = [evaluate_plan(loss_fn, stream, p, batch_size=4, per_position=True, progress=False) for p in plans]
    for a, b in zip(first, again):
        assert a.loss == b.loss and a.per_position_loss == b.per_position_loss
        assert sum(a.per_position_loss) / len(a.per_position_loss) == pytest.approx(a.loss, rel=1e-12)
    # the loss over the same scored tokens by direct cross-entropy on each window
    plan = plans[0]
    direct = []
    for start in plan.starts:
        window = torch.as_tensor(stream[start : start + 9])
        logits = model(window[None, :-1])[0]
        direct.append(nn.functional.cross_entropy(logits, window[1:], reduction="sum").item())
    assert first[0].loss == pytest.approx(sum(direct) / plan.scored_tokens, rel=1e-6)


def test_memory_estimate_by_hand() -> None:
    common = dict(batch=1, length=1024, hidden=64, heads=4, vocab=100, logit_chunk=1024)
    activations = 12 * 1024 * 64 * 4
    logits = 3 * 1024 * 100 * 4
    eager = estimate_forward_bytes(attention_impl="eager", **common)
    assert eager == activations + (3 * 4 + 4) * 1024 * 1024 * 4 + logits
    flex = estimate_forward_bytes(attention_impl="flex", **common)
    assert flex == activations + 4 * 4 * 1024 * 4 + logits


def test_batch_shrinks_to_fit_then_refuses() -> None:
    def estimate(batch: int) -> int:
        return 100 * batch

    assert fit_batch_size(64, estimate, 1000, length=512, attention_impl="sdpa") == 8
    with pytest.raises(EvaluationError, match=r"length 512 does not fit in memory.*attention_impl=flex"):
        fit_batch_size(64, estimate, 50, length=512, attention_impl="sdpa")


def test_suffix_scoring_matches_the_full_loss_of_a_gpt_model() -> None:
    from kerple import positional
    from kerple.model.gpt import GPTModel

    torch.manual_seed(0)
    embedding = positional.build("kerple_log", num_heads=2, head_dim=8, hidden_size=16, max_positions=32)
    model = GPTModel(num_layers=1, hidden_size=16, num_attention_heads=2, padded_vocab_size=32, positional=embedding).eval()
    tokens = torch.randint(0, 32, (3, 21))
    loss_fn = model_loss_fn(model, logit_chunk_bytes=4 * 32 * 3 * 4)  # 4-position logit chunks
    with torch.no_grad():
        full = loss_fn(tokens[:, :-1], tokens[:, 1:], 0)
        suffix = loss_fn(tokens[:, :-1], tokens[:, 1:], 13)
        reference = model.chunked_loss(tokens[:, :-1], tokens[:, 1:], chunk_size=20)
    assert full.shape == (3, 20) and suffix.shape == (3, 7)
    torch.testing.assert_close(full, reference)
    torch.testing.assert_close(suffix, reference[:, 13:])


def test_per_document_losses_by_hand() -> None:
    """Documents [3 1 4 1 5] [9 2 6] [5 3 5 8 9]; labels 1 4 1 5 | 9 2 6 5 | 3 5 8 9 (windows of 4)."""
    (plan,) = nonoverlap(len(STREAM), [4])
    document_of = np.repeat([0, 1, 2], [5, 3, 5])
    result = evaluate_plan(label_plus_position, STREAM, plan, batch_size=2, progress=False, document_of=document_of)
    # document 0 owns labels at stream 1-4 (window 0, positions 0-3); document 1 stream 5-7
    # (window 1, positions 0-2); document 2 stream 8-12 (window 1 position 3, window 2 positions 0-3).
    expected = {
        0: ((1 + 4 + 1 + 5) / 100 + (0 + 1 + 2 + 3) / 10) / 4,
        1: ((9 + 2 + 6) / 100 + (0 + 1 + 2) / 10) / 3,
        2: ((5 + 3 + 5 + 8 + 9) / 100 + (3 + 0 + 1 + 2 + 3) / 10) / 5,
    }
    rows = result.per_document
    assert [row["document"] for row in rows] == [2, 0, 1]  # most scored tokens first
    assert [row["tokens"] for row in rows] == [5, 4, 3]
    for row in rows:
        assert row["loss"] == pytest.approx(expected[row["document"]])
        assert row["ppl"] == pytest.approx(math.exp(expected[row["document"]]))
    assert sum(r["loss"] * r["tokens"] for r in rows) / 12 == pytest.approx(result.loss)


def test_a_split_with_token_ids_beyond_the_vocabulary_is_refused(tmp_path) -> None:
    from kerple.config import load_config
    from kerple.data.indexed_dataset import IndexedDatasetWriter
    from kerple.evaluation.errors import EvaluationError
    from kerple.evaluation.runner import load_split_documents

    with IndexedDatasetWriter(tmp_path / "c", dtype=np.uint16) as writer:
        for start in range(4):
            writer.add_document(np.arange(start, start + 60))  # ids up to 62
        writer.finalize()
    overrides = {"data_path": str(tmp_path / "c"), "split": "1,1,0", "make_vocab_size_divisible_by": 1}
    assert len(load_split_documents(load_config([], {**overrides, "vocab_size": 63}), "valid")) == 2
    with pytest.raises(EvaluationError, match="holds token id 62, beyond the model's vocabulary of 50 "):
        load_split_documents(load_config([], {**overrides, "vocab_size": 50}), "valid")


def test_a_missing_evaluation_split_names_its_key(tmp_path) -> None:
    from kerple.config import load_config
    from kerple.data.errors import DataError
    from kerple.evaluation.runner import load_split_documents

    cfg = load_config([], {"valid_data_paths": [str(tmp_path / "gone")], "data_path": str(tmp_path / "also_gone")})
    with pytest.raises(DataError, match=r"^valid_data_paths \S+gone \(<command line>\): \S+gone.idx and \S+gone.bin not found; "
                                        r"fix the path in the config, or prepare the data \(prepare_data.py\)$"):
        load_split_documents(cfg, "valid")
    with pytest.raises(DataError, match=r"^data_path \S+also_gone \(<command line>\): "):
        load_split_documents(cfg, "test")


def test_eod_mask_loss_leaves_the_token_after_each_eod_unscored_at_every_length() -> None:
    """With 5 as the end-of-document id: inputs 5 at stream indices 4, 8 and 10, so the labels at
    5, 9 and 11 (9, 3, 8) are not scored; nine labels remain, 1 4 1 5 2 6 5 5 9 (sum 38)."""
    plans = nonoverlap(len(STREAM), [2, 4])  # T = 12 labels, stream[1:13]
    short, long = (evaluate_plan(label_plus_position, STREAM, plan, per_position=True, progress=False,
                                 unscored_after=5) for plan in plans)
    assert short.scored_tokens == long.scored_tokens == 9
    assert [scored_token_count(plan, STREAM, 5) for plan in plans] == [9, 9]
    # window positions of the scored labels at length 4: 0 1 2 3 | 1 2 3 | 1 3 (sum 16); at length 2: 0 1 0 1 | 1 0 1 | 1 1 (6)
    assert long.loss == pytest.approx(38 / 900 + 16 / 90)
    assert short.loss == pytest.approx(38 / 900 + 6 / 90)
    assert long.per_position_loss == pytest.approx([1 / 100, 11 / 300 + 0.1, 7 / 200 + 0.2, 19 / 300 + 0.3])
    unmasked = evaluate_plan(label_plus_position, STREAM, plans[1], progress=False)
    assert unmasked.scored_tokens == 12 and scored_token_count(plans[1], STREAM, None) == 12
