"""The scatter-free gradients of the dense positional bias against autograd of the plain gather.

References are written independently of the code under test: the distance of query ``i`` (absolute
position ``k - q + i``) to key ``j`` is computed here, the dense bias is gathered with ordinary
indexing, masked with ``masked_fill`` and pushed through an explicit softmax; autograd then gives
the reference gradients. Everything in float64, with random tables, several blocks of query rows
(lengths above ``BACKWARD_BLOCK``), fewer queries than keys, and attention windows.
"""

from __future__ import annotations

import pytest
import torch

from kerple.model import sdpa_cpu
from kerple.positional.base import diagonal_gather, diagonal_sums, gather_by_distance

DTYPE = torch.float64


def _signed_distance(q_len: int, k_len: int) -> torch.Tensor:
    """``d[i, j] = (k_len - q_len + i) - j`` as int64 ``[q, k]``."""
    return (k_len - q_len + torch.arange(q_len))[:, None] - torch.arange(k_len)[None, :]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_diagonal_sums_match_a_loop() -> None:
    grad = torch.randn(2, 3, 5, 8, generator=_generator(0), dtype=DTYPE)
    expected = torch.zeros(2, 3, 5 + 8 - 1, dtype=DTYPE)
    for i in range(5):
        for j in range(8):
            expected[..., i - j + 8 - 1] += grad[..., i, j]
    torch.testing.assert_close(diagonal_sums(grad), expected, rtol=0, atol=1e-12)


def test_diagonal_gather_reads_one_value_per_diagonal() -> None:
    values = torch.arange(4 + 6 - 1, dtype=DTYPE)
    expected = (_signed_distance(4, 6) + 4 - 1).to(DTYPE)  # values[c] == c
    torch.testing.assert_close(diagonal_gather(values, 4, 6), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="diagonal values"):
        diagonal_gather(values, 4, 5)


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (1, 9), (7, 7), (5, 12), (300, 300)])
def test_gather_by_distance_matches_plain_gather(q_len: int, k_len: int) -> None:
    table = torch.randn(3, k_len, generator=_generator(q_len), dtype=DTYPE, requires_grad=True)
    reference = table[:, _signed_distance(q_len, k_len).clamp(min=0)]  # [H, q, k]
    dense = gather_by_distance(table, q_len, k_len)
    torch.testing.assert_close(dense, reference, rtol=0, atol=0)
    upstream = torch.randn(reference.shape, generator=_generator(1), dtype=DTYPE)
    (expected,) = torch.autograd.grad(reference, table, upstream)
    (actual,) = torch.autograd.grad(dense, table, upstream)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


def _reference_attention(q, k, v, table, window):  # type: ignore[no-untyped-def]
    """Explicit softmax attention with the plain gathered bias (float64)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    distance = _signed_distance(q_len, k_len)
    allowed = distance >= 0
    if window is not None:
        allowed &= distance < window
    bias = table[:, distance.clamp(min=0)]  # [H', q, k]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return probs @ v


def _diagonals(table: torch.Tensor, q_len: int, k_len: int, window: int | None) -> torch.Tensor:
    """The model's construction (AttentionContext.sdpa_diagonals): the table, -inf where invisible."""
    if window is not None:
        table = table.masked_fill(torch.arange(k_len) >= window, float("-inf"))
    above = table.new_full((table.shape[0], q_len - 1), float("-inf"))
    return torch.cat([above, table], dim=-1)


@pytest.mark.parametrize(
    "q_len,k_len,window,heads,learnable",
    [
        (300, 300, None, 3, True),
        (300, 300, 40, 3, True),
        (70, 300, None, 3, True),
        (70, 300, 100, 3, True),
        (130, 130, 200, 1, True),  # a head-broadcast mask: its gradient sums over the heads
        (300, 300, 40, 3, False),  # a fixed mask: the fused kernel's own backward
    ],
)
def test_masked_attention_matches_autograd(
    q_len: int, k_len: int, window: int | None, heads: int, learnable: bool
) -> None:
    gen = _generator(q_len + k_len)
    q = torch.randn(2, 3, q_len, 16, generator=gen, dtype=DTYPE, requires_grad=True)
    k = torch.randn(2, 3, k_len, 16, generator=gen, dtype=DTYPE, requires_grad=True)
    v = torch.randn(2, 3, k_len, 16, generator=gen, dtype=DTYPE, requires_grad=True)
    table = (-torch.rand(heads, 1, generator=gen, dtype=DTYPE) * torch.log1p(torch.arange(k_len, dtype=DTYPE)))
    table = (table + 0.1 * torch.randn(heads, k_len, generator=gen, dtype=DTYPE)).requires_grad_(learnable)
    upstream = torch.randn(2, 3, q_len, 16, generator=gen, dtype=DTYPE)
    inputs = [q, k, v] + ([table] if learnable else [])

    reference = _reference_attention(q, k, v, table, window)
    expected = torch.autograd.grad(reference, inputs, upstream)
    assert sdpa_cpu.supported(q, 0.0)
    diagonals = _diagonals(table, q_len, k_len, window)
    mask = diagonal_gather(diagonals, q_len, k_len).detach()[None]
    output = sdpa_cpu.masked_attention(q, k, v, mask, diagonals if learnable else None, window)
    actual = torch.autograd.grad(output, inputs, upstream)

    torch.testing.assert_close(output, reference, rtol=1e-10, atol=1e-10)
    for name, got, want in zip("qkvt", actual, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10, msg=name)
    if learnable:
        assert expected[3].abs().sum() > 0


def test_unsupported_calls_are_refused() -> None:
    query = torch.zeros(1, 1, 4, 8)
    assert not sdpa_cpu.supported(query, 0.1)  # dropout
    assert not sdpa_cpu.supported(query.bfloat16(), 0.0)
    assert sdpa_cpu.key_range(0, 128, 300, 0, None) == (0, 128)
    assert sdpa_cpu.key_range(128, 256, 300, 0, 40) == (89, 256)
