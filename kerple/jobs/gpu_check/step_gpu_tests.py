"""Step 2: ``pytest -m gpu`` (FlexAttention vs eager forward and backward for every embedding at head
dimensions 16, 64 and 128 in fp32, bf16 and fp16, fp16 loss scaling, ...) with its summary, each
failing test's assertion text, and what the budget left out.

Runs in a subprocess with ``DS_ACCELERATOR=cuda``, on several pytest-xdist workers when the plugin
is installed (compilation is CPU-bound; the tests are small on the GPU), and is stopped when the
step's budget runs out. Parsed from pytest's ``-q`` output: the closing line (``3 failed, 105 passed
in 92.31s``, no ``=`` around it in quiet mode), the ``E`` lines of each failure section (the
assertion text; the short summary truncates it to the terminal's width), and on a timeout the
progress lines (``-o console_output_style=count``: ``..F.s  [ 5/108]``), which say how many of the
collected tests finished.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time

from kerple.jobs.gpu_check.context import StepContext
from kerple.jobs.process import run_child

NAME = "pytest -m gpu"
SUMMARY = re.compile(
    r"^=*[ \t]*(\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)\b.*?) in [\d.]+s"
    r"(?: \([\d:]+\))?[ \t]*=*$", re.MULTILINE)
SECTION = re.compile(r"^_{3,} (?:ERROR at (?:setup|teardown) of )?(.+?) _{3,}$")
PROGRESS = re.compile(r"^([.FEsxX]+)[ \t]*(?:\[\s*(\d+)/(\d+)\])?$")  # console_output_style=count
TAIL_LINES = 40


def command(workers: int) -> list[str]:
    """The pytest command line (``workers`` > 1: pytest-xdist)."""
    parallel = ["-n", str(workers)] if workers > 1 else []
    return [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfE", "--tb=short", "-p", "no:cacheprovider",
            "-o", "console_output_style=count", *parallel, "tests"]


def workers() -> int:
    """Half the CPU cores, at most 8, when pytest-xdist is installed; else 1."""
    if importlib.util.find_spec("xdist") is None:
        return 1
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def failure_messages(output: str) -> dict[str, str]:
    """``{section title: assertion text}`` from the failure sections (their ``E`` lines)."""
    messages: dict[str, str] = {}
    title = None
    for line in output.splitlines():
        header = SECTION.match(line)
        if header:
            title = header.group(1)
            messages.setdefault(title, "")
        elif title is not None and line.startswith("E "):
            messages[title] = (messages[title] + " " + line[1:].strip()).strip()
        elif line.startswith("=") and title is not None and "short test summary" in line:
            break
    return messages


def failing_tests(output: str) -> list[tuple[str, str]]:
    """``(test id, message)`` per ``FAILED``/``ERROR`` line, the message from its failure section."""
    sections = failure_messages(output)
    rows = []
    for line in output.splitlines():
        if not line.startswith(("FAILED ", "ERROR ")):
            continue
        test, _, short = line.split(" ", 1)[1].partition(" - ")
        title = test.split("::", 1)[-1].replace("::", ".")
        rows.append((test, (sections.get(title) or short)[:600]))
    return rows


def progress(output: str) -> tuple[int | None, int]:
    """(tests collected, ``None`` before the first progress count; tests finished) from the progress
    lines (``..F.s  [ 5/108]``: one character per finished test, the count at the line's end)."""
    collected, finished = None, 0
    for line in output.splitlines():
        match = PROGRESS.match(line.strip())
        if match:
            finished += len(match.group(1))
            collected = int(match.group(3)) if match.group(3) else collected
    return collected, finished


def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "output tail: " + " / ".join(text.splitlines()[-lines:])


def run(ctx: StepContext) -> None:
    ctx.require_cuda("without CUDA every gpu-marked test skips")
    # this checkout first on PYTHONPATH (runner.main); a wide terminal keeps pytest's lines whole
    env = {**os.environ, "DS_ACCELERATOR": "cuda", "COLUMNS": "400"}
    count = workers()
    ctx.result.notes.append(f"{count} pytest worker(s)")
    lines: list[str] = []
    budget = max(ctx.remaining(), 1.0)
    done = run_child(command(count), on_line=lines.append, deadline=time.monotonic() + budget, stop_signal=None,
                     env=env)
    output, code = "\n".join(lines), done.returncode
    if done.killed:  # pytest and its workers: the whole group
        collected, finished = progress(output)
        left = "unknown" if collected is None else str(collected - finished)
        ctx.result.reason = (f"stopped after {budget:.0f} s (the step's budget): {finished} tests finished, "
                             f"{left} left out")
        ctx.result.metrics = {"finished": finished, "collected": collected}
        _report_failures(ctx, output)
        ctx.result.notes.append(tail(output))
        return
    match = SUMMARY.search(output)
    summary = match.group(1) if match else f"no pytest summary (exit {code})"
    ctx.result.metrics = {"summary": summary, "exit_code": code}
    ctx.result.reason = summary
    ctx.result.status = "passed" if code == 0 else "failed"
    _report_failures(ctx, output)
    if code != 0:
        ctx.result.notes.append(tail(output))


def _report_failures(ctx: StepContext, output: str) -> None:
    rows = failing_tests(output)
    if rows:
        ctx.result.table("Failing tests", ["test", "assertion text"]).rows += [list(row) for row in rows]
