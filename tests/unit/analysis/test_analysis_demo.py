"""``make analysis-demo`` without ``make demo``'s checkpoints says what to run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_missing_demo_checkpoints_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = importlib.util.spec_from_file_location("analysis_demo", REPO / "tools" / "analysis_demo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.main(["--runs", str(tmp_path / "no-runs"), "--results", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("analysis_demo.py: error: ") and "run `make demo` first" in error
    assert not (tmp_path / "out").exists()
