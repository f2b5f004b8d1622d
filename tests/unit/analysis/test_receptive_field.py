"""Empirical receptive field (thesis §4.5.1) against the theoretical one of windowed attention."""

from __future__ import annotations

import pytest
import torch

from kerple.analysis.receptive_field import (
    cumulative_from_end, empirical_receptive_field, receptive_field, share_within,
)
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


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", ["alibi", "learned"])
def test_normalized_gradients_equal_the_embedding_rows_gradients(name: str) -> None:
    """Thesis §4.5.1: ``s_m = ||g_m|| / Σ_n ||g_n||``, ``g_m`` the gradient of the last token's loss by
    the input embedding ``e_m``, averaged over sequences. With distinct tokens in a sequence, ``g_m`` is
    the gradient of the word-embedding row of token ``m`` (and, with a learned table, of row ``m`` of
    the position table), computed here one sequence at a time."""
    length, count = 20, 5
    model = tiny_model(name, init_method_std=0.2).eval()
    generator = torch.Generator().manual_seed(2)
    windows = torch.stack([torch.randperm(VOCAB, generator=generator)[: length + 1] for _ in range(count)])
    expected = torch.zeros(length, dtype=torch.float64)
    for window in windows:
        model.zero_grad(set_to_none=True)
        logits = model(window[None, :-1])[0, -1]
        torch.nn.functional.cross_entropy(logits[None], window[None, -1]).backward()
        rows = model.embedding.word_embeddings.weight.grad[window[:-1]].double()  # [L, h] g_m
        norms = rows.norm(dim=-1)
        expected += norms / norms.sum() / count
        if name == "learned":
            table = dict(model.positional.named_parameters())
            (position_table,) = [p for p in table.values() if p.grad is not None and p.grad.dim() == 2]
            assert torch.allclose(position_table.grad[:length].double(), rows, atol=1e-7)
    model.zero_grad(set_to_none=True)
    shares = receptive_field(model, windows, progress=False)["per_position"]
    assert shares == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-9)


def test_erf_is_the_thesis_definition_read_from_the_end() -> None:
    """§4.5.1 restated: ``c_m = Σ_{n=m}^{L} s_n`` (1-based), the ERF counts the most recent tokens from
    the last ``m`` with ``c_m > 0.99`` to the end: ``L - max{m : c_m > 0.99} + 1``."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        shares = torch.rand(30, generator=generator, dtype=torch.float64) ** 6
        shares /= shares.sum()
        length = len(shares)
        c = {m: float(shares[m - 1 :].sum()) for m in range(1, length + 1)}
        expected = length - max(m for m in c if c[m] > 0.99) + 1
        cumulative = cumulative_from_end(shares)
        assert empirical_receptive_field(cumulative) == expected
        assert share_within(cumulative, 8) == pytest.approx(c[length - 7])
        assert share_within(cumulative, 100) == pytest.approx(1.0)


def test_plot_labels_the_erf_threshold() -> None:
    from kerple.analysis.receptive_field import plot_receptive_fields

    figure = plot_receptive_fields({"a": {"cumulative": [0.5, 0.995, 1.0], "erf": 2}}, 2, "t")
    assert "ERF threshold 0.99" in figure.axes[0].get_legend_handles_labels()[1]
