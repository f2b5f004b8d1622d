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
