"""The position probe of thesis Fig. 2.2 on states whose answer is known."""

from __future__ import annotations

import torch

import pytest

from kerple.analysis.position_probe import constant_guess_error, fit_probe, plot_probe, probe_errors


def test_linear_probe_reads_a_linear_position_code_and_not_noise() -> None:
    generator = torch.Generator().manual_seed(0)
    count, length, width = 8, 50, 16
    noise = torch.randn(count, length, width, generator=generator)
    coded = noise.clone()
    coded[..., 3] = torch.arange(length, dtype=torch.float32) * 0.1  # one coordinate holds the position
    exact, blind = probe_errors([coded, noise], "linear", progress=False)
    assert exact < 1e-2
    assert abs(blind - length / 4) < 3  # no information: about the mean absolute deviation of a uniform position


@pytest.mark.usefixtures("one_thread")  # 1000 small Adam steps: 1.5 s on one thread, 15-25 s on two shared cores
def test_mlp_probe_learns_a_nonlinear_code() -> None:
    length = 40
    positions = torch.arange(length, dtype=torch.float32)
    angle = positions / length * 3.0
    states = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).expand(6, length, 2).contiguous()
    (error,) = probe_errors([states], "mlp", progress=False)
    assert error < 2.0


def test_constant_guess_error_by_hand() -> None:
    """Fig. 2.2: "predicting the middle point of L = 256 gives an MAE of 128" at L = 512."""
    assert constant_guess_error(512) == 128.0
    assert constant_guess_error(5) == pytest.approx((2 + 1 + 0 + 1 + 2) / 5)


def test_mlp_probe_is_the_thesis_two_layer_relu_network() -> None:
    """§2.8.1 / §2.2: a two-layer network with a ReLU in between."""
    probe = fit_probe(torch.randn(20, 4, generator=torch.Generator().manual_seed(0)), torch.arange(20.0), "mlp",
                      steps=2)
    layers = [module for module in probe.modules() if not list(module.children())]
    assert [type(m).__name__ for m in layers] == ["Linear", "ReLU", "Linear"]


def test_probe_plot_has_whole_layer_ticks_and_the_baseline() -> None:
    figure = plot_probe({"alibi": [10.0, 8.0, 5.0]}, 64, "probe")
    axis = figure.axes[0]
    assert list(axis.get_xticks()) == [0, 1, 2]
    assert "constant guess (L-1)/2, L = 64" in axis.get_legend_handles_labels()[1]
    assert axis.get_ylabel() == "position MAE (tokens)"
