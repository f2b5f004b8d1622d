"""The GPU check's steps on a CPU: step 2 reads real ``pytest -q`` output (the closing line, each
failure's full assertion text, and for a run stopped by its budget how many collected tests
finished); step 3 fails a case whose flex run lost a positional gradient; step 4 judges the
throughput targets and refuses rows whose positional parameters did not train."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kerple.jobs.gpu_check import step_correctness, step_gpu_tests, step_throughput
from kerple.jobs.gpu_check.step_throughput import target_checks

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


def _fake_run(positional: dict[str, torch.Tensor]) -> dict[str, object]:
    return {"logits": torch.ones(2, 3), "input": torch.ones(2, 3), "positional": positional}


def test_correctness_fails_a_case_where_flex_loses_a_positional_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager has a gradient for bias_p and flex none. The case must fail, not pass as 'n/a'."""
    grads = {"bias_p": torch.ones(4), "bias_a": torch.ones(4)}
    runs = {"eager": _fake_run(grads), "flex": _fake_run({})}
    assert step_correctness.missing_gradients(runs["flex"], runs["eager"]) == ["bias_p", "bias_a"]
    assert step_correctness._errors(runs["flex"], runs["eager"])[2] == math.inf

    class Model:
        vocab_size = 8
        _flex = type("Flex", (), {"last_options": "BLOCK_M=128"})()

        def train(self, mode: bool) -> None:
            pass

    monkeypatch.setattr(step_correctness, "_run", lambda model, impl, tokens, grads: runs[impl])
    models = type("Models", (), {"get": lambda self, precision, name: (Model(), None)})()
    ctx = type("Ctx", (), {"cuda": True, "device": torch.device("cpu")})()
    row = step_correctness._compare(ctx, models, "kerple_log", 16, "fp32")
    assert row[-1] == "no flex gradient for bias_p, bias_a (eager has one)"
    runs["flex"] = _fake_run(grads)
    assert step_correctness._compare(ctx, models, "kerple_log", 16, "fp32")[-1] == "ok"


def test_unchanged_names_the_parameters_training_left_alone() -> None:
    before = {"bias_p": torch.tensor([1.0, 2.0]), "bias_a": torch.tensor([3.0])}
    after = {"bias_p": torch.tensor([1.0, 2.0]), "bias_a": torch.tensor([3.0001])}
    assert step_throughput.unchanged(before, after) == ["positional.bias_p"]


def test_positional_values_read_the_fp32_masters_of_bf16_parameters() -> None:
    """An update below bf16's resolution leaves the bf16 parameter as it was (so comparing it called a
    training kernel frozen on the GPU) but moves its fp32 master: the check must see the master."""
    from kerple.training.master_adamw import MasterAdamW

    positional = torch.nn.Module()
    positional.bias_a = torch.nn.Parameter(torch.tensor([1.0]))
    trainer = type("Trainer", (), {"model": type("Model", (), {"positional": positional})()})()
    trainer.optimizer = MasterAdamW([{"params": [positional.bias_a]}], dtype=torch.bfloat16, lr=1e-4)
    before = step_throughput.positional_values(trainer)
    positional.bias_a.grad = torch.ones(1, dtype=torch.bfloat16)
    trainer.optimizer.step()
    assert positional.bias_a.item() == 1.0  # 1 - 1e-4 rounds back to 1 in bf16
    assert step_throughput.unchanged(before, step_throughput.positional_values(trainer)) == []
    trainer.optimizer.copies = []  # the bf16 parameter alone: unchanged
    assert step_throughput.unchanged(before, step_throughput.positional_values(trainer)) == ["positional.bias_a"]


def test_throughput_rows_of_frozen_positional_parameters_are_invalid(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed steps that leave a learnable embedding's parameters unchanged make the row invalid and
    the step fail; embeddings without learnable parameters are measured as usual."""
    from kerple.jobs.gpu_check.context import SCALES, StepContext
    from kerple.jobs.gpu_check.report import StepResult

    monkeypatch.setattr(step_throughput, "_cell", lambda ctx, trainer, peak, tokens: (0.5, 0.1, 1024))
    result = StepResult(4, step_throughput.NAME)
    ctx = StepContext(torch.device("cpu"), SCALES["tiny-quick"], tmp_path, result, time.monotonic() + 300)
    step_throughput.run(ctx)
    rows = {(row[0], row[2]): row[-1] for row in result.tables[0].rows if row[1] == "off"}
    assert rows[("kerple_log", "sdpa (auto)")].startswith("invalid: positional.bias_p, positional.bias_a unchanged")
    assert rows[("rpe", "sdpa (auto)")].startswith("invalid: positional.")
    assert rows[("none", "sdpa (auto)")] == "" and rows[("alibi", "sdpa (auto)")] == ""
    assert result.status == "failed" and "invalid (positional parameters did not train)" in result.reason
    assert "kerple_log sdpa (auto) (compile off)" in result.reason


def test_profile_busy_fraction_and_kernel_ranking() -> None:
    """GPU busy time is the union of kernel intervals (overlaps once); kernels rank by total time."""
    from types import SimpleNamespace

    from kerple.jobs.gpu_check.step_profile import interval_union, kernel_summary

    assert interval_union([(0, 10), (5, 15), (20, 30), (22, 25)]) == 25
    assert interval_union([]) == 0

    def kernel(name: str, start: float, end: float) -> SimpleNamespace:
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end,
                                                                       elapsed_us=lambda: end - start))

    kernels = [kernel("gemm", 0, 40), kernel("softmax", 30, 50), kernel("gemm", 60, 100), kernel("copy", 100, 101)]
    busy, rows = kernel_summary(kernels, steps=2, wall_us=200)
    assert busy == pytest.approx(91 / 200)
    assert [row[0] for row in rows] == ["gemm", "softmax", "copy"]
    assert rows[0][1:] == ["1", "0.040", f"{80 / 101:.1%}"]  # 2 calls over 2 steps, 80 µs of 101
    assert kernel_summary([], steps=1, wall_us=10) == (None, [])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a CUDA device")
def test_quick_without_a_gpu_says_nothing_was_checked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--quick on a CPU machine ran the harness's CPU test and ended 'passed' with a 0.00 TFLOP/s peak."""
    from kerple.jobs.gpu_check import runner

    with pytest.raises(SystemExit) as stopped:
        runner.main(["--quick", "--output", str(tmp_path / "report")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "sees no CUDA device: nothing was checked" in err and err.count("\n") == 1
    assert not (tmp_path / "report").exists()
