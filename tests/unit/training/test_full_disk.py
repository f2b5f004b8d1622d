"""A full disk (ENOSPC) while training: one line, nothing half-written left, and the same command works
once there is room. The disk is simulated by sending the writes of the checkpoint files after the
first to ``/dev/full``, which fails every write with ENOSPC the way a full file system does."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
import yaml

import kerple.atomic as atomic
from kerple.errors import USER_ERROR_STATUS, entry_point
from kerple.training import cli as training_cli
from tiny_run import REPO, tiny_overrides, write_corpus

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full to simulate a full disk")


def run_config(tmp_path: Path) -> list[str]:
    corpus = write_corpus(tmp_path / "data" / "corpus")
    save = tmp_path / "ck"
    values = tiny_overrides(corpus, train_iters=4, lr_decay_iters=4, save=str(save), load=str(save), save_interval=2)
    config = tmp_path / "run.yml"
    config.write_text(yaml.safe_dump(values))
    return [str(REPO / "configs/models/tiny.yml"), str(config)]


def disk_full_after(files: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoint files after the first ``files`` are written to /dev/full (every write: ENOSPC)."""
    opened = []

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):  # noqa: ANN001, ANN202 - open's own signature
        if "w" in mode and ".tmp-global_step" in str(path):
            opened.append(path)
            if len(opened) > files:
                return open("/dev/full", mode, *args, **kwargs)
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(atomic, "open", open_on_a_full_disk, raising=False)


def test_a_full_disk_during_a_save_is_one_line_and_the_same_command_then_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    argv = run_config(tmp_path)
    disk_full_after(1, monkeypatch)
    assert training_cli.train_main(argv) == USER_ERROR_STATUS
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "No space left on device" in errors[0], errors
    assert "the partial files were removed" in errors[0] and "holds no checkpoint of this run yet" in errors[0]
    save = tmp_path / "ck"
    assert not list(save.glob(".tmp-*")) and not (save / "latest").exists()
    monkeypatch.undo()  # room again
    assert training_cli.train_main(argv) == 0
    assert (save / "latest").read_text() == "global_step4"


def test_a_full_disk_at_the_lock_does_not_stop_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock file's process id could not be written: the run traced back before its first step."""
    argv = run_config(tmp_path)
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".train.lock"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    assert training_cli.train_main(argv) == 0


def test_any_command_reports_a_full_disk_in_one_line(capsys: pytest.CaptureFixture) -> None:
    @entry_point("tool.py")
    def main() -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "out/r.json")

    assert main() == USER_ERROR_STATUS
    assert capsys.readouterr().err == ("tool.py: error: No space left on device writing out/r.json: free disk space, "
                                       "or choose a folder on another disk, then run the same command again\n")

    @entry_point("tool.py")
    def other() -> int:
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(OSError):  # not a full disk: not turned into a user error here
        other()


class FillingFile(io.FileIO):
    """A file on a disk with ``ROOM`` bytes left: a write past them fails with ENOSPC."""

    ROOM = 600_000

    def write(self, data: bytes) -> int:
        if self.tell() + memoryview(data).nbytes > self.ROOM:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_torch_save_atomic_raises_the_write_error_of_a_full_disk(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk filling up in the middle of a tensor: torch's zip writer raised 'RuntimeError: [enforce
    fail at inline_container.cc] unexpected pos', and the save was not reported as a full disk."""
    import torch

    monkeypatch.setattr(atomic, "open", lambda path, mode="r": FillingFile(path, mode), raising=False)
    with pytest.raises(OSError) as raised:
        atomic.torch_save_atomic({"w": torch.zeros(1_000_000)}, tmp_path / "w.pt")
    assert raised.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []
