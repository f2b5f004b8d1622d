"""Step 2: ``pytest -m gpu`` (FlexAttention vs eager gradients incl. the learnable KERPLE/T5
parameters, fp16 loss scaling, ...) with its summary and the failing tests.

Runs in a subprocess with ``DS_ACCELERATOR=cuda`` and is stopped when the step's budget runs out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from benchmarks.gpu_check.context import REPO, StepContext

NAME = "pytest -m gpu"
SUMMARY = re.compile(r"=+ (.*\d+ (?:passed|failed|error|skipped|deselected).*) in [\d.]+s")


def run(ctx: StepContext) -> None:
    ctx.require_cuda("without CUDA every gpu-marked test skips")
    env = {**os.environ, "DS_ACCELERATOR": "cuda"}  # PYTHONPATH: this checkout first (runner.main)
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rfE", "-p", "no:cacheprovider", "tests"]
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=max(ctx.remaining(), 1.0))
    except subprocess.TimeoutExpired as timeout:
        ctx.result.reason = f"stopped after {timeout.timeout:.0f} s (the step's budget)"
        ctx.result.notes.append(_tail(timeout.stdout))
        return
    output = done.stdout + done.stderr
    match = SUMMARY.search(output)
    summary = match.group(1) if match else f"no pytest summary (exit {done.returncode})"
    failures = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    table = ctx.result.table("Failing tests", ["test", "message"])
    for line in failures:
        test, _, message = line.partition(" - ")
        table.rows.append([test.split(" ", 1)[-1], message[:200]])
    ctx.result.metrics = {"summary": summary, "exit_code": done.returncode}
    ctx.result.reason = summary
    ctx.result.status = "passed" if done.returncode == 0 else "failed"
    if done.returncode not in (0, 1):
        ctx.result.notes.append(_tail(output))


def _tail(text: str | bytes | None, lines: int = 30) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "output tail: " + " / ".join((text or "").splitlines()[-lines:])
