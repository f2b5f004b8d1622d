"""deepy.py -d DIR: YAML paths relative to a config directory, the form of GPT-NeoX's README."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kerple.training import cli

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("flag", ["-d", "--conf_dir"])
def test_paths_are_joined_to_the_config_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: str) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(cli, "run_child", lambda command: calls.append(command) or 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # tiny.yml saves to and loads from checkpoints/tiny: away from a Quick start run in the repository
    run = tmp_path / "checkpoints"
    argv = ["train.py", flag, str(REPO / "configs"), "models/tiny.yml", "pe/alibi.yml", f"log_dir={tmp_path}", f"save={run}",
            f"load={run}", "seed=7"]
    assert cli.deepy_main(argv) == 0
    written = yaml.safe_load(Path(calls[0][-1]).read_text())
    assert written["pos_emb"] == "alibi" and written["num_layers"] == 2 and written["seed"] == 7


def test_missing_file_under_the_directory_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(cli, "run_child", lambda command: 0)
    assert cli.deepy_main(["train.py", "-d", str(tmp_path), "125M.yml"]) == 2
    assert str(tmp_path / "125M.yml") in capsys.readouterr().err
