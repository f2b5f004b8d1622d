"""What ``analyze.py`` writes and prints means what it says: units and references beside the numbers,
refusals instead of NaN results, one line instead of a traceback when memory runs out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kerple.analysis import cli
from tests.unit.analysis.test_analyze_end_to_end import run, setup  # noqa: F401 - the module's fixture

Setup = tuple[list[str], Path]


def refused(setup: Setup, capsys: pytest.CaptureFixture, command: str, *options: str) -> str:
    words, folder = setup
    output = folder / f"refused-{command}.json"
    assert cli.main([command, *words, *options, "--output", str(output)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("analyze.py: error: ")]
    assert len(errors) == 1, errors
    assert not output.exists() and not output.with_suffix(".png").exists()
    return errors[0]


@pytest.mark.parametrize("options, flag", [(("--samples", "1"), "--samples 1"),
                                           (("--samples", "4", "--num-sequences", "1"), "--num-sequences 1")])
def test_a_variance_of_one_sample_is_refused(setup: Setup, capsys: pytest.CaptureFixture, options: tuple[str, ...],
                                             flag: str) -> None:
    """One sample has no variance: the curve was all NaN, written into the JSON as a result."""
    assert flag in refused(setup, capsys, "nope-variance", "--length", "8", *options)


def test_a_probe_of_one_position_is_refused(setup: Setup, capsys: pytest.CaptureFixture) -> None:
    """At --length 1 every target is position 0: the MLP probe's MAE was written as a result."""
    assert "--length 1" in refused(setup, capsys, "position-probe", "--length", "1", "--probe", "mlp")


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB"),
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                                                "can't allocate memory: you tried to allocate 160000000000 bytes")])
def test_running_out_of_memory_is_one_line(setup: Setup, capsys: pytest.CaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch, error: RuntimeError) -> None:
    """receptive-field at --length 100000 on a CPU raised the allocator's RuntimeError with a traceback."""
    def exhausted(*_args: object, **_kwargs: object) -> None:
        raise error

    monkeypatch.setattr(cli.receptive_field, "receptive_field", exhausted)
    line = refused(setup, capsys, "receptive-field", "--length", "16", "--num-sequences", "2")
    assert "receptive-field ran out of memory on cpu at --length 16" in line and "--device" in line


def test_other_runtime_errors_still_propagate(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(cli.receptive_field, "receptive_field", broken)
    words, folder = setup
    with pytest.raises(RuntimeError, match="shape mismatch"):
        cli.main(["receptive-field", *words, "--length", "16", "--output", str(folder / "broken.json")])


def test_receptive_field_reports_the_share_within_the_train_length(setup: Setup, capsys: pytest.CaptureFixture) -> None:
    """The share of the gradient inside the train length (8 for the fixture) is ``c`` at 8 read from the end."""
    doc = run(setup, "receptive-field", "--length", "24", "--num-sequences", "2")
    (result,) = doc["runs"].values()
    assert result["train_length"] == 8
    assert result["share_in_train_length"] == pytest.approx(sum(result["per_position"][-8:]))
    err = capsys.readouterr().err
    assert f"{result['share_in_train_length']:.1%} of it within the last 8 (the train length)" in err


def test_attention_stats_print_units_and_the_uniform_reference(setup: Setup, capsys: pytest.CaptureFixture) -> None:
    doc = run(setup, "attention-stats", "--lengths", "8,32", "--num-sequences", "2")
    long = doc["lengths"][1]
    harmonic = sum(1 / n for n in range(1, 33)) / 32  # causal rows: row i sees i + 1 keys
    assert long["uniform_pmax"] == pytest.approx(harmonic)
    assert long["uniform_entropy"] == pytest.approx(float(torch.arange(1, 33).double().log().mean()))
    assert long["mean_pmax"] >= long["uniform_pmax"] and long["mean_entropy"] <= long["uniform_entropy"] + 1e-9
    err = capsys.readouterr().err
    assert f"mean entropy {long['mean_entropy']:.4f} nats (uniform: {long['uniform_entropy']:.4f})" in err


def test_alignment_says_whether_the_grid_reached_the_target(setup: Setup, capsys: pytest.CaptureFixture) -> None:
    doc = run(setup, "align-temperature", "--length", "32", "--mode", "both", "--num-sequences", "2")
    err = capsys.readouterr().err
    for mode, result in doc["modes"].items():
        values = list(result["grid"].values())
        assert result["reached"] == (min(values) <= result["target"] <= max(values))
        assert result["gap"] == pytest.approx(result["grid"][f"{result['temperature']:g}"] - result["target"])
        assert f"mode {mode}: τ = {result['temperature']:g} (" in err
        assert ("not aligned" in err.split(f"mode {mode}:")[1].splitlines()[0]) == (not result["reached"])


def test_position_probe_reports_the_constant_guess(setup: Setup, capsys: pytest.CaptureFixture) -> None:
    doc = run(setup, "position-probe", "--length", "8", "--num-sequences", "8")
    assert doc["constant_guess_mae"] == 2.0  # |0..7 - 3.5| averages 2 = L/4
    assert "position MAE (tokens) by layer" in capsys.readouterr().err


def test_nope_variance_records_lemma_2_2_and_warns_when_property_2_1_fails(
        setup: Setup, capsys: pytest.CaptureFixture) -> None:
    """The fixture is d = 8, H = 2: at σ = 0.02 the logit variance 64·1.6e-7/2 is tiny; at σ = 0.5 it is 2."""
    words, folder = setup
    for sigma, variance, noted in (("0.02", 64 * 0.02**4 / 2, False), ("0.5", 64 * 0.5**4 / 2, True)):
        output = folder / f"nope-{sigma}.json"
        assert cli.main(["nope-variance", words[0], "--no-progress", "--length", "8", "--samples", "4",
                         "--sigma", sigma, "--output", str(output)]) == 0
        assert json.loads(output.read_text())["logit_variance"] == pytest.approx(variance)
        assert ("Property 2.1" in capsys.readouterr().err) == noted
