"""Attention sharpness (thesis §5.3.3 and Algorithm 1) against the probabilities the model's own eager
kernel uses, for every registered embedding: the statistics rebuild the rows block by block, so any
difference from the forward (a rotation, a scale table, the temperature of a bias) shows up here."""

from __future__ import annotations

import math

import pytest
import torch

from kerple import positional
from kerple.analysis.attention_stats import attention_statistics
from kerple.model import attention as attention_module
from tests.unit.model.model_helpers import HEADS, LAYERS, VOCAB, tiny_model


def captured_probabilities(model: torch.nn.Module, tokens: torch.Tensor, tau: float,
                           monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Each layer's softmax rows ``[b, H, s, s]`` from the eager kernel: its output with the identity
    as values is ``probs @ I = probs``."""
    eager = attention_module.KERNELS["eager"]
    rows: list[torch.Tensor] = []

    def recording(query, key, value, context, training):  # noqa: ANN001, ANN202 - the kernel's signature
        identity = torch.eye(key.shape[-2]).expand(*key.shape[:2], -1, -1)  # [b, H, k, k]
        rows.append(eager(query, key, identity, context, training).detach())
        return eager(query, key, value, context, training)

    monkeypatch.setitem(attention_module.KERNELS, "eager", recording)
    previous = model.softmax_temperature
    model.set_temperature(tau)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        model.set_temperature(previous)
    monkeypatch.setitem(attention_module.KERNELS, "eager", eager)
    return rows


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", positional.names())
def test_statistics_are_those_of_the_kernel_probabilities(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """P_max = max_k p and H = -Σ_k p ln p of every row (thesis §5.4), averaged over batch and rows."""
    tau, length = 0.7, 18
    model = tiny_model(name, init_method_std=0.3).eval()
    tokens = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(3))
    probabilities = captured_probabilities(model, tokens, tau, monkeypatch)
    assert len(probabilities) == LAYERS
    stats = attention_statistics(model, tokens, temperature=tau, block_rows=5, progress=False)
    for layer, probs in enumerate(probabilities):
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5)
        pmax = probs.amax(-1).mean(dim=(0, 2))  # [H]
        logs = torch.where(probs > 0, probs.clamp_min(1e-38).log(), torch.zeros(()))
        entropy = -(probs * logs).sum(-1).mean(dim=(0, 2))
        for head in range(HEADS):
            assert stats["pmax"][layer][head] == pytest.approx(float(pmax[head]), rel=1e-4), (layer, head)
            assert stats["entropy"][layer][head] == pytest.approx(float(entropy[head]), rel=1e-4, abs=1e-6)
    assert stats["mean_pmax"] == pytest.approx(float(torch.stack([p.amax(-1).mean() for p in probabilities]).mean()),
                                               rel=1e-4)
    assert not math.isnan(stats["mean_entropy"])
