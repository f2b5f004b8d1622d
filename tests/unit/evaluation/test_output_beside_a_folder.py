"""An output inside a --load folder is refused only where that folder holds a checkpoint: a folder
without one is reported as such (it used to be called "the checkpoint this command reads")."""

from __future__ import annotations

from pathlib import Path

from kerple.evaluation import cli as evaluate_cli


def test_an_empty_load_folder_is_reported_as_holding_no_run(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    code = evaluate_cli.main(["--load", str(folder), "--eval-lengths", "64", "--output", str(folder / "e.json")])
    error = capsys.readouterr().err
    assert code == 2 and "the checkpoint this command reads" not in error
    assert f"{folder} has no 'latest' file and no checkpoint files: it holds no trained run" in error
    assert not (folder / "e.json").exists()
