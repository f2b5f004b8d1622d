"""deepy.py: YAMLs and overrides are validated once; the script's own --flags reach every rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kerple.training import cli

REPO = Path(__file__).resolve().parents[3]


def launched(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> list[str]:
    calls: list[list[str]] = []
    monkeypatch.setattr(cli, "run_child", lambda command: calls.append(command) or 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli.deepy_main(argv) == 0
    assert len(calls) == 1
    return calls[0]


def test_evaluate_flags_pass_through_and_config_is_evaluation_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    configs = [str(REPO / "configs/models/tiny.yml"), str(REPO / "configs/pe/kerple_log.yml")]
    command = launched(monkeypatch, ["evaluate.py", *configs, f"log_dir={tmp_path}", "attention_impl=flex",
                                     "--load", "ckpt", "--eval-lengths", "128,256", "--per-position"])
    script = command.index("evaluate.py")
    resolved = Path(command[script + 1])
    assert command[script + 2:] == ["--load", "ckpt", "--eval-lengths", "128,256", "--per-position"]
    written = yaml.safe_load(resolved.read_text())
    # flex has no CPU backward, so this config only validates because nothing is trained.
    assert written["train_iters"] == 0 and written["attention_impl"] == "flex"


def test_training_launch_keeps_train_iters(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    configs = [str(REPO / "configs/models/tiny.yml"), str(REPO / "configs/pe/alibi.yml")]
    command = launched(monkeypatch, ["train.py", *configs, f"log_dir={tmp_path}", "train_iters=7"])
    assert command[-2] == "train.py"
    assert yaml.safe_load(Path(command[-1]).read_text())["train_iters"] == 7
