"""xPos (Sun et al. 2022, arXiv 2212.10554): the rotation and decay against the paper's formula in complex form."""

from __future__ import annotations

import pytest
import torch

import kerple.positional as positional

HEAD_DIM = 8


def build(**options) -> positional.PositionalEmbedding:
    return positional.build("xpos", num_heads=2, head_dim=HEAD_DIM, hidden_size=16, max_positions=64, **options)


def test_decay_by_hand() -> None:
    # ζ_c = (2c/d + γ)/(1 + γ), d = 8, γ = 0.4
    expected = torch.tensor([0.4 / 1.4, 0.65 / 1.4, 0.9 / 1.4, 1.15 / 1.4])
    torch.testing.assert_close(build().decay, expected)


def reference_scores(query: torch.Tensor, key: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``Re Σ_c q_c conj(k_c) e^{i(n-m)θ_c} ζ_c^{(n-m)/B}`` with ``q_c = q[c] + i q[c + d/2]`` (the halves
    layout of GPT-NeoX), ``θ_c = 10000^(-2c/d)``, B = 512: ``[q, k]`` scores of one head."""
    half = HEAD_DIM // 2
    pair = torch.arange(half, dtype=torch.float64)
    theta = 10000.0 ** (-2 * pair / HEAD_DIM)
    zeta = (2 * pair / HEAD_DIM + 0.4) / 1.4
    q_complex = torch.complex(query[..., :half].double(), query[..., half:].double())  # [q, d/2]
    k_complex = torch.complex(key[..., :half].double(), key[..., half:].double())
    distance = (n[:, None] - m[None, :]).double()[..., None]  # [q, k, 1]
    factor = torch.exp(1j * distance * theta) * zeta ** (distance / 512.0)
    return (q_complex[:, None, :] * k_complex.conj()[None, :, :] * factor).real.sum(-1)


@pytest.mark.parametrize("offset", [0, 300, 5000])
def test_scores_equal_the_complex_formula(offset: int) -> None:
    module = build()
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 1, 5, HEAD_DIM, generator=generator)
    key = torch.randn(1, 1, 7, HEAD_DIM, generator=generator)
    n, m = torch.arange(offset + 2, offset + 7), torch.arange(offset, offset + 7)
    rotated_q, rotated_k = module.rotate(query, key, n, m)
    scores = (rotated_q @ rotated_k.transpose(-1, -2))[0, 0]
    torch.testing.assert_close(scores.double(), reference_scores(query[0, 0], key[0, 0], n, m), rtol=1e-4, atol=1e-5)


def test_a_large_scale_base_is_rotary() -> None:
    """ζ^(t/B) -> 1 as B grows: xPos reduces to the rotary embedding it extends."""
    xpos = build(xpos_scale_base=1e12)
    rotary = positional.build("rotary", num_heads=2, head_dim=HEAD_DIM, hidden_size=16, max_positions=64)
    query = torch.randn(1, 2, 6, HEAD_DIM)
    positions = torch.arange(10, 16)
    rotated = zip(xpos.rotate(query, query, positions, positions), rotary.rotate(query, query, positions, positions))
    for ours, theirs in rotated:
        torch.testing.assert_close(ours, theirs)


def test_the_decay_shrinks_distant_scores() -> None:
    """A unit vector on pair 0 keeps its length under the rotation, so ``|q_n|·|k_m|`` is ``ζ_0^((n - m)/B)``."""
    module = build()
    vector = torch.zeros(1, 1, 1, HEAD_DIM)
    vector[..., 0] = 1.0  # pair c = 0: ζ_0 = 0.4/1.4, the fastest decay
    scales = []
    for distance in (0, 256, 512, 1024):
        rotated_q, rotated_k = module.rotate(vector, vector, torch.tensor([distance]), torch.tensor([0]))
        scales.append(float(rotated_q.norm() * rotated_k.norm()))
    assert scales == pytest.approx([(0.4 / 1.4) ** (d / 512) for d in (0, 256, 512, 1024)], rel=1e-5)
