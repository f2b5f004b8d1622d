"""``kerple.errors``: the project's errors print one line and give 2; anything else keeps its traceback."""

from __future__ import annotations

import pytest

from kerple.checkpoint.errors import CheckpointError
from kerple.config import ConfigError
from kerple.data.errors import DataError
from kerple.errors import INTERRUPTED_STATUS, USER_ERROR_STATUS, KerpleError, entry_point
from kerple.evaluation.errors import EvaluationError, ProtocolError
from kerple.inference import GenerationError
from kerple.training.batches import DataTooShortError
from kerple.training.errors import TrainingDivergedError, TrainingError


@pytest.mark.parametrize(
    "error_class",
    [ConfigError, DataError, DataTooShortError, EvaluationError, ProtocolError, GenerationError, TrainingError,
     TrainingDivergedError, CheckpointError],
)
def test_every_user_error_derives_from_kerple_error(error_class: type) -> None:
    assert issubclass(error_class, KerpleError)


def raising(error: BaseException):
    @entry_point("tool.py")
    def main(argv: list[str]) -> int:
        raise error

    return main


def test_a_project_error_is_one_line_and_status_2(capsys: pytest.CaptureFixture) -> None:
    assert raising(DataError("corpus.jsonl: input file not found"))([]) == USER_ERROR_STATUS == 2
    assert capsys.readouterr().err == "tool.py: error: corpus.jsonl: input file not found\n"


def test_ctrl_c_is_one_line_and_status_130(capsys: pytest.CaptureFixture) -> None:
    """Ctrl-C during evaluate.py printed a traceback; during train.py's imports, 77 lines."""
    assert raising(KeyboardInterrupt())([]) == INTERRUPTED_STATUS == 130
    assert capsys.readouterr().err == "tool.py: interrupted\n"


def test_the_checkpoint_error_is_reported_like_a_project_error(capsys: pytest.CaptureFixture) -> None:
    assert raising(CheckpointError("ckpt: does not exist"))([]) == 2
    assert capsys.readouterr().err == "tool.py: error: ckpt: does not exist\n"


@pytest.mark.parametrize("bug", [ZeroDivisionError("division by zero"), ValueError("bad shape"), RuntimeError("x")])
def test_other_exceptions_propagate(bug: Exception, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(type(bug)):
        raising(bug)([])
    assert capsys.readouterr().err == ""


def test_the_return_value_and_arguments_pass_through() -> None:
    @entry_point("tool.py")
    def main(argv: list[str], *, offset: int = 0) -> int:
        return len(argv) + offset

    assert main(["a", "b"], offset=1) == 3
    assert main.__name__ == "main"


def test_a_config_loaded_quietly_prints_no_override_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """The project's log shows a command's config overrides; a config loaded for the command's own use
    (``run_config(quiet=True)``: the demo's figures) shows none, and the log is shown again after it."""
    from kerple.errors import show_project_log
    from kerple.runs import run_config

    show_project_log()
    words = ["configs/models/tiny.yml", "configs/pe/kerple_log.yml", "seq_length=64"]
    run_config(words, quiet=True)
    assert "seq_length" not in capsys.readouterr().err
    run_config(words)
    assert "seq_length: 128 (configs/models/tiny.yml) -> 64 (<command line>)" in capsys.readouterr().err
