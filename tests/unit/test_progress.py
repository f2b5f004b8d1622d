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


def test_off_a_terminal_nested_bars_write_no_cursor_codes_and_a_time_total_is_a_share(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate.py's overall bar counts estimated seconds and holds a per-length bar below it: in a log
    they gave `14.345376519999943/145.29060812092933` and a line `ESC [A` after every batch."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    overall = progress.progress_bar(total=145.29060812092933, desc="evaluation", unit="s", delay=0, mininterval=0,
                                    bar_format="{l_bar}{bar}| {elapsed}<{remaining}")
    inner = progress.progress_bar(total=4, desc="eval L=64", leave=False, delay=0, mininterval=0)
    for _ in range(4):
        inner.update()
        inner.set_postfix(loss="6.1")
        overall.update(14.345376519999943)
    inner.close()
    overall.close()
    text = stream.getvalue()
    assert "\x1b" not in text and "\r" not in text and "14.34" not in text
    assert "evaluation:  10% [" in text and "eval L=64: 4/4" in text
    assert len(text.splitlines()) == len(set(text.splitlines()))


def test_off_a_terminal_a_postfix_waits_for_the_next_timed_line(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with progress.progress_bar(total=100, desc="work", delay=0) as bar:  # mininterval: PLAIN_INTERVAL
        for step in range(100):
            bar.update()
            bar.set_postfix(loss=f"{step}")  # tqdm redraws on every call
    assert len(stream.getvalue().splitlines()) <= 2  # the first state and the closing one
