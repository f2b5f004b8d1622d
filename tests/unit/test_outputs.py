"""Output paths are checked before the work that fills them, and the checks create nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerple.errors import UsageError
from kerple.outputs import check_output_file, check_output_folder


def test_a_file_where_a_folder_is_needed_and_the_reverse(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError, match=r"^save .*a-file is a file; a folder is needed there"):
        check_output_folder(tmp_path / "a-file", "save")
    with pytest.raises(UsageError, match=r"^--output .* is a folder; name a file"):
        check_output_file(tmp_path, "--output")


def test_a_path_under_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError, match=r"a-file is a file, not a folder; choose a path outside it"):
        check_output_file(tmp_path / "a-file" / "deeper" / "r.json", "--output")
    with pytest.raises(UsageError, match=r"a-file is a file, not a folder"):
        check_output_folder(tmp_path / "a-file" / "run", "log_dir")


def test_a_folder_that_cannot_hold_a_file_is_refused() -> None:
    with pytest.raises(UsageError, match=r"cannot write in /proc .*choose a writable path"):
        check_output_file("/proc/no-such/r.json", "--output")


def test_an_output_that_is_an_input_is_refused_however_it_is_spelled(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "run.yml"
    config.write_text("lr: 1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"is also read or written by this command \(as run.yml\)"):
        check_output_file(tmp_path / "." / "run.yml", "--output", inputs=["run.yml"])
    assert config.read_text() == "lr: 1\n"


def test_an_output_inside_a_checkpoint_the_command_reads_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ck" / "global_step4").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"is inside .*ck, the checkpoint this command reads"):
        check_output_file(tmp_path / "ck" / "latest", "--output", folders=[tmp_path / "ck"])
    check_output_file(tmp_path / "ck-results.json", "--output", folders=[tmp_path / "ck"])  # beside it: fine


def test_a_good_path_passes_and_nothing_is_created(tmp_path: Path) -> None:
    check_output_file(tmp_path / "new" / "deeper" / "r.json", "--output")
    check_output_folder(tmp_path / "run" / "checkpoints", "save")
    assert list(tmp_path.iterdir()) == []  # no folder made, no scratch file left
