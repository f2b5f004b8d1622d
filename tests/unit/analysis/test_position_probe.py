"""The position probe of thesis Fig. 2.2 on states whose answer is known."""

from __future__ import annotations

import torch

from kerple.analysis.position_probe import probe_errors


def test_linear_probe_reads_a_linear_position_code_and_not_noise() -> None:
    generator = torch.Generator().manual_seed(0)
    count, length, width = 8, 50, 16
    noise = torch.randn(count, length, width, generator=generator)
    coded = noise.clone()
    coded[..., 3] = torch.arange(length, dtype=torch.float32) * 0.1  # one coordinate holds the position
    exact, blind = probe_errors([coded, noise], "linear", progress=False)
    assert exact < 1e-2
    assert abs(blind - length / 4) < 3  # no information: about the mean absolute deviation of a uniform position


def test_mlp_probe_learns_a_nonlinear_code() -> None:
    length = 40
    positions = torch.arange(length, dtype=torch.float32)
    angle = positions / length * 3.0
    states = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).expand(6, length, 2).contiguous()
    (error,) = probe_errors([states], "mlp", progress=False)
    assert error < 2.0
