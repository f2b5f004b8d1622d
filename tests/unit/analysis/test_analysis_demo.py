"""``make analysis-demo`` without ``make demo``'s checkpoints says what to run."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerple.jobs import analysis_demo


def test_missing_demo_checkpoints_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert analysis_demo.main(["--runs", str(tmp_path / "no-runs"), "--results", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("analysis_demo.py: error: ") and "run `make demo` first" in error
    assert not (tmp_path / "out").exists()


def test_summary_says_n_a_for_missing_perplexities_and_marks_an_unreached_tau() -> None:
    """Perplexities read from the wrong folder printed as 'nan' in the table; τ = 0.5 at the grid's end
    read as an aligned temperature."""
    summary = {
        "perplexities_from": "results/elsewhere",
        "receptive_field": {"alibi": {"erf": 200, "share_in_train_length": 0.8, "ppl": {}},
                            "t5": {"erf": 250, "share_in_train_length": 0.5, "ppl": {"64": 120.0, "256": 150.0}}},
        "alignment": {"alibi": {"pmax_train": 0.3, "pmax_long": 0.2, "entropy_train": 2.0, "entropy_long": 3.0,
                                "tau_pmax": 0.7, "tau_entropy": 0.5, "tau_log": 0.75, "pmax_reached": True,
                                "entropy_reached": False}},
        "passkey": {},
        "nope_variance": {"hidden_size": 128, "sigma": 0.02, "length": 256, "ratios": [1.0, 1.0, 1.0]},
    }
    text = analysis_demo.summary_table(summary, 64, 256)
    assert "nan" not in text
    assert "| alibi | 200 | 0.800 | n/a | n/a |" in text and "| t5 | 250 | 0.500 | 120.0 | 150.0 |" in text
    assert "no perplexity in results/elsewhere/<embedding>.json" in text and "--demo-results" in text
    assert "| 0.7 | 0.5 † | 0.750 |" in text and "†: the grid's end" in text
    assert "entropy @ 64 (nats)" in text
