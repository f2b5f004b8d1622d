"""The GPU check's steps on a CPU: step 2 reads real ``pytest -q`` output (the closing line, each
failure's full assertion text, and for a run stopped by its budget how many collected tests
finished); step 4 judges the throughput targets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_check import step_gpu_tests
from benchmarks.gpu_check.step_throughput import target_checks

LONG = "x" * 150  # longer than any terminal line: the short summary alone would cut it
MODULE = f'''
import pytest

def test_passes():
    assert True

@pytest.mark.parametrize("name", ["alpha", "gauss_bias3"])
def test_compares(name):
    error = 0.031 if name == "gauss_bias3" else 0.0
    assert error < 0.02, ("positional.bias_p", "{LONG}")

def test_skips():
    pytest.skip("needs a CUDA GPU")

def test_errors_in_setup(missing_fixture):
    pass
'''


def _pytest_output(folder: Path, workers: int) -> tuple[str, int]:
    (folder / "test_sample.py").write_text(MODULE)
    command = step_gpu_tests.command(workers)
    marker = command.index("gpu")
    del command[marker - 1:marker + 1]  # no ``-m gpu`` filter: run the sample
    command[-1] = str(folder)
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})
    return done.stdout + done.stderr, done.returncode


@pytest.mark.parametrize("workers", [1, 2])
def test_summary_failures_and_progress_from_real_output(tmp_path: Path, workers: int) -> None:
    output, code = _pytest_output(tmp_path, workers)
    assert code == 1
    assert step_gpu_tests.SUMMARY.search(output).group(1) == "1 failed, 2 passed, 1 skipped, 1 error"
    failures = dict(step_gpu_tests.failing_tests(output))
    assert set(failures) == {"test_sample.py::test_compares[gauss_bias3]", "test_sample.py::test_errors_in_setup"}
    message = failures["test_sample.py::test_compares[gauss_bias3]"]
    assert "AssertionError" in message and "positional.bias_p" in message and LONG in message
    assert "missing_fixture" in failures["test_sample.py::test_errors_in_setup"]
    assert step_gpu_tests.progress(output) == (5, 5)


def test_progress_of_a_run_stopped_midway() -> None:
    """What a timeout leaves: progress lines with counts, no closing line."""
    partial = "bringing up nodes...\n\n" + "." * 40 + "   [ 40/108]\n" + ".F.s" + " " * 30 + "\n"
    assert step_gpu_tests.progress(partial) == (108, 44)
    assert step_gpu_tests.SUMMARY.search(partial) is None


def test_quiet_closing_line_with_and_without_rules() -> None:
    quiet = "....\n3 failed, 105 passed, 2 warnings in 92.31s (0:01:32)\n"
    ruled = "===== 1 passed in 0.01s =====\n"
    assert step_gpu_tests.SUMMARY.search(quiet).group(1) == "3 failed, 105 passed, 2 warnings"
    assert step_gpu_tests.SUMMARY.search(ruled).group(1) == "1 passed"
    assert sys.executable == step_gpu_tests.command(1)[0]


def test_throughput_targets() -> None:
    best = {"none": ("sdpa", 500_000.0, 0.55), "kerple_log": ("flex", 480_000.0, 0.53),
            "alibi": ("flex", 440_000.0, 0.49), "rpe": ("flex", 460_000.0, 0.50)}
    checks = target_checks(best, {"kerple_log", "alibi", "rpe", "sandwich"}, "NVIDIA H100 80GB HBM3")
    assert [text for text, met in checks.items() if not met] == ["alibi within 10% of none (0.880)"]
    assert "kerple_log >= 450,000 tokens/s on an H100 (480,000)" in checks
    assert "kerple_log within 5% of none (0.960)" in checks and "kerple_log MFU >= 50% (53.0%)" in checks
    elsewhere = target_checks(best, {"kerple_log"}, "NVIDIA A100-SXM4-80GB")
    assert not any("tokens/s" in text for text in elsewhere)  # the tokens/s figure is an H100's
    assert target_checks({"kerple_log": ("flex", 1.0, 0.1)}, {"kerple_log"}, "GPU") == {"kerple_log MFU >= 50% (10.0%)": False}
