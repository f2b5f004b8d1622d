"""NoPE position in the variance (thesis §2.3): a random model against Lemma 2.3's d²σ⁴/m."""

from __future__ import annotations

import math

import pytest
import torch

from kerple import positional
from kerple.analysis.nope_variance import lemma_variance, random_model_variance
from kerple.model import GPTModel

HIDDEN, HEADS, LENGTH = 64, 4, 64


def test_random_model_variance_follows_lemma_2_3() -> None:
    """σ = 0.02, d = 64: σ⁴ ≪ H/d² (Property 2.1). 400 samples in 40 weight draws: measured within
    3% of the lemma at every position for seeds 0-2; tolerance 8% per position, and a log-log slope
    of -1 within 0.03."""
    sigma = 0.02
    pe = positional.build("none", num_heads=HEADS, head_dim=HIDDEN // HEADS, hidden_size=HIDDEN, max_positions=LENGTH)
    model = GPTModel(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, padded_vocab_size=256,
                     positional=pe, flex_compile=False).eval()
    measured = random_model_variance(model, LENGTH, sigma, samples=400, batch_size=10, seed=0, progress=False)
    expected = [HIDDEN**2 * sigma**4 / m for m in range(1, LENGTH + 1)]
    assert lemma_variance(HIDDEN, sigma, LENGTH) == expected
    for m, (value, theory) in enumerate(zip(measured, expected), start=1):
        assert abs(value / theory - 1) < 0.08, (m, value, theory)
    slope = (math.log(measured[-1]) - math.log(measured[0])) / math.log(LENGTH)
    assert abs(slope + 1) < 0.03


def test_lemma_2_2_logit_variance_is_the_thesis_number() -> None:
    """§2.3.2: "The numerical variance of l_mn/sqrt(d/H) in our case is 768²·0.02⁴/12 ≈ 0.0079"."""
    from kerple.analysis.nope_variance import SMALL_LOGIT_VARIANCE, logit_variance

    assert logit_variance(768, 12, 0.02) == pytest.approx(0.0079, abs=5e-5)
    assert logit_variance(768, 12, 0.02) < SMALL_LOGIT_VARIANCE < logit_variance(768, 12, 0.2)  # Fig. 2.5's σ = 0.2
