"""gpu_reproduce.py's options: every bad input is one line `gpu_reproduce.py: error: ...` and status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerple.reproduce.cli import main
from kerple.reproduce.plan import TINY, Settings
from kerple.reproduce.state import State


def error_line(capsys: pytest.CaptureFixture) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_reproduce.py: error: "), lines
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "lots"], "--tokens 'lots': expected a count such as 600M"),
    (["--minutes", "-1"], "--minutes -1: give a positive number of minutes, or 0 for no limit"),
    (["--pos-emb", "kerple,alibi"], "--pos-emb 'kerple': no configs/pe/kerple.yml"),
])
def test_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    assert main(["--scale", "tiny", "--work", str(tmp_path), *argv]) == 2
    assert message in error_line(capsys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_the_full_scale_needs_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--work", str(tmp_path), "--no-readme", "--docs", str(tmp_path / "page.md")]) == 2
    assert "needs a CUDA GPU (torch sees none); on a CPU, check the orchestration with --scale tiny" in error_line(capsys)


def test_a_readme_without_markers_is_refused_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no section\n")
    assert main(["--scale", "tiny", "--work", str(tmp_path / "work"), "--readme", str(readme)]) == 2
    assert "needs one line <!-- gpu-reproduce:begin -->" in error_line(capsys) and not (tmp_path / "work").exists()


def test_a_work_folder_keeps_its_settings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    State(tmp_path / "state.json", Settings(TINY, 7680, ("alibi",), tmp_path).fingerprint()).save()
    assert main(["--scale", "tiny", "--work", str(tmp_path), "--tokens", "15360"]) == 2
    assert "was started with other settings (steps 60 -> 120)" in error_line(capsys)
    assert main(["--scale", "tiny", "--work", str(tmp_path), "--report-only"]) == 0
    page = (tmp_path / "report" / "reproduce-tiny.md").read_text()
    assert "**Status:** pending: no GPU has run this." in page
