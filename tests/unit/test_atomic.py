"""kerple.atomic: writes land whole or not at all, and never leave a temporary file behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from kerple.atomic import atomic_path, torch_save_atomic, write_bytes_atomic, write_json_atomic, write_text_atomic


def test_success_renames_into_place(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    with atomic_path(target) as temporary:
        assert temporary.parent == tmp_path and temporary != target
        assert not target.exists()
        temporary.write_text("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_exception_leaves_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_path(target) as temporary:
            temporary.write_text("half-writ")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_keyboard_interrupt_cleans_up_without_a_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "new.bin"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as temporary:
            temporary.write_bytes(b"x")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_failing_writer_keeps_old_torch_file(tmp_path: Path) -> None:
    target = tmp_path / "state.pt"
    torch_save_atomic({"a": torch.ones(2)}, target)

    class Unpicklable:
        def __reduce__(self):
            raise TypeError("cannot pickle")

    with pytest.raises(TypeError, match="cannot pickle"):
        torch_save_atomic({"a": Unpicklable()}, target)
    assert torch.equal(torch.load(target)["a"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_helpers_create_parents_and_return_the_target(tmp_path: Path) -> None:
    text = write_text_atomic(tmp_path / "a" / "t.md", "± table\n")
    doc = write_json_atomic(tmp_path / "b" / "r.json", {"ppl": [1.5, float("nan")]})
    raw = write_bytes_atomic(tmp_path / "c" / "x.bin", b"\x00\x01")
    assert text.read_text(encoding="utf-8") == "± table\n"
    assert doc.read_text().endswith("\n")
    assert json.loads(doc.read_text())["ppl"][0] == 1.5
    assert raw.read_bytes() == b"\x00\x01"
    for folder in ("a", "b", "c"):
        assert len(list((tmp_path / folder).iterdir())) == 1


def test_written_file_gets_the_mode_of_a_plain_open(tmp_path: Path) -> None:
    """Not mkstemp's private 0600: other users of a shared folder can read checkpoints and results."""
    previous = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "results.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == 0o644
