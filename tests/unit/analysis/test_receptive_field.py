"""Empirical receptive field (thesis §4.5.1) against the theoretical one of windowed attention."""

from __future__ import annotations

import pytest
import torch

from kerple.analysis.receptive_field import cumulative_from_end, empirical_receptive_field, receptive_field
from tests.unit.model.model_helpers import LAYERS, VOCAB, tiny_model


@pytest.mark.parametrize("name, window", [("none", 5), ("alibi", 7), ("rotary", 4)])
def test_windowed_attention_bounds_the_receptive_field(name: str, window: int) -> None:
    """R layers of windowed attention see ``R·(w-1)`` tokens back: the gradient beyond is exactly
    zero, so ``erf <= R·(w-1) + 1`` (thesis §4.5, TRF = wR)."""
    length = 40
    model = tiny_model(name, window=window, init_method_std=0.2).eval()
    windows = torch.randint(0, VOCAB, (6, length + 1), generator=torch.Generator().manual_seed(0))
    result = receptive_field(model, windows, progress=False)
    reach = LAYERS * (window - 1)  # largest distance from the last input that can matter
    shares = result["per_position"]
    assert all(share == 0.0 for share in shares[: length - 1 - reach])
    assert all(share > 0.0 for share in shares[length - 1 - reach :])
    assert result["erf"] <= reach + 1
    assert result["cumulative"][reach] == pytest.approx(1.0)
    assert sum(shares) == pytest.approx(1.0)


def test_full_attention_reaches_the_first_token() -> None:
    model = tiny_model("none", init_method_std=0.2).eval()
    windows = torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(1))
    assert receptive_field(model, windows, progress=False)["per_position"][0] > 0.0


def test_cumulative_share_and_erf_by_hand() -> None:
    shares = torch.tensor([0.004, 0.006, 0.49, 0.5], dtype=torch.float64)  # oldest first
    cumulative = cumulative_from_end(shares)
    assert cumulative == pytest.approx([0.5, 0.99, 0.996, 1.0])
    assert empirical_receptive_field(cumulative) == 3  # 0.99 is not > 0.99
    assert empirical_receptive_field([0.2, 0.5, 0.9]) == 3  # never above: the whole length
