"""Progress bars print plain lines, not carriage-return redraws, when stderr is not a terminal."""

from __future__ import annotations

import io
import sys

import pytest

from kerple import progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_the_bar_is_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with progress.progress_bar(total=3, desc="work", delay=0, mininterval=0) as bar:
        for _ in range(3):
            bar.update()
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0].startswith("work: 0/3") and lines[-1].startswith("work: 3/3")
    assert len(lines) == len(set(lines)) == 4  # one line per state, the closing redraw not repeated


def test_short_work_off_a_terminal_prints_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    for _ in progress.progress_bar(range(100), desc="quick"):
        pass
    assert stream.getvalue() == ""  # under PLAIN_INTERVAL seconds: silent


def test_on_a_terminal_it_is_tqdm_redrawn_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", stream)
    for _ in progress.progress_bar(range(3), desc="tty", mininterval=0):
        pass
    assert "\r" in stream.getvalue() and "tty" in stream.getvalue()


def test_disabled_prints_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    for _ in progress.progress_bar(range(3), disable=True, delay=0, mininterval=0):
        pass
    assert stream.getvalue() == ""
