"""`make gpu-check`'s harness end to end on a CPU at tiny scale.

Every step that can run on a CPU runs (the CUDA-only ones skip with a reason); a step made to fail
does not stop the later ones; a second run of one step is merged into the existing report; the
report files are whole JSON / Markdown with nothing temporary left beside them; and a step run in
its own process is reported, or killed and reported as failed when it overruns its budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerple.jobs.gpu_check import STEP_MODULES, runner, step_correctness


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def test_cpu_run_reports_every_step_and_survives_a_failing_one(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "report"

    def broken(ctx) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("injected failure")

    monkeypatch.setattr(step_correctness, "run", broken)
    assert runner.main(["--device", "cpu", "--output", str(out), "--in-process"]) == 1
    report = _report(out)
    assert {"date", "device", "torch", "cuda", "python", "deepspeed"} <= set(report["environment"])
    steps = report["steps"]
    assert list(steps) == [str(n) for n in sorted(STEP_MODULES) if n != 8]  # the profile runs with --profile
    assert {n: s["status"] for n, s in steps.items()} == {
        "1": "passed", "2": "skipped", "3": "failed", "4": "passed", "5": "passed", "6": "skipped", "7": "passed"}
    assert "injected failure" in steps["3"]["reason"]
    assert "CUDA" in steps["2"]["reason"] and "fp16" in steps["6"]["reason"]
    for step in steps.values():
        assert step["seconds"] >= 0 and step["budget_seconds"] > 0 and step["environment"]["device"] == "CPU"
        for table in step["tables"]:
            assert table["rows"] and all(len(row) == len(table["columns"]) for row in table["rows"])

    cells = {(row[0], row[1], row[2]): row for row in steps["4"]["tables"][0]["rows"]}
    assert cells[("kerple_log", "off", "sdpa (auto)")][4]  # tokens/s measured
    assert cells[("kerple_log", "off", "flex")][-1].startswith("n/a: FlexAttention has no backward")
    assert cells[("kerple_log", "off", "triton")][4] and not cells[("kerple_log", "off", "triton")][-1]  # interpreter
    assert cells[("none", "on", "all")][-1].startswith("skipped: compile")
    assert any("6·N + 12·L·h·s" in note for note in steps["4"]["notes"])
    training = steps["5"]["metrics"]
    assert training["last_tenth_loss"] < training["first_tenth_loss"]
    assert training["max_resume_difference"] == 0.0  # fp32 on a CPU: the resumed run is bitwise the same
    markdown = (out / "report.md").read_text()
    assert "| 3 | correctness: FlexAttention vs eager | failed |" in markdown
    assert "## 7. long-context evaluation: memory and speed: passed" in markdown

    monkeypatch.undo()  # STEPS=3 again, now working: merged, the other steps kept as they were
    assert runner.main(["--device", "cpu", "--output", str(out), "--in-process", "--steps", "3"]) == 0
    merged = _report(out)["steps"]
    assert merged["3"]["status"] == "passed" and merged["3"]["tables"][0]["rows"][0][-1] == "ok"
    assert {n: merged[n] for n in steps if n != "3"} == {n: steps[n] for n in steps if n != "3"}
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["report.json", "report.md"]

    assert runner.main(["--device", "cpu", "--output", str(out), "--steps", "3,9"]) == 2
    assert "unknown step '9'" in capsys.readouterr().err


def test_isolated_steps_report_or_are_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = runner.parse_args(["--device", "cpu", "--output", str(tmp_path)])
    assert args.work.is_relative_to(runner.WORK) and not args.work.is_relative_to(tmp_path)  # scratch outside
    args.work = tmp_path / "work"
    args.work.mkdir(parents=True)
    skipped = runner.run_step_isolated(2, args, budget=120.0)  # the child's own result file is read back
    assert skipped.status == "skipped" and "CUDA" in skipped.reason
    monkeypatch.setattr(runner, "KILL_GRACE_S", 0.5)
    killed = runner.run_step_isolated(5, args, budget=0.5)
    assert killed.status == "failed" and killed.reason.startswith("killed after")


def test_quick_run_writes_its_report_after_every_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--quick``: steps 1, 3, 4 with the lease's embeddings, the report rewritten after each case (a
    run killed from outside returns what it finished), scratch outside the report folder."""
    out, written = tmp_path / "report", []
    original = runner.reports.write

    def recording_write(directory: Path, report: dict) -> None:
        written.append(json.loads(json.dumps(report)))
        original(directory, report)

    monkeypatch.setattr(runner.reports, "write", recording_write)
    assert runner.main(["--quick", "--device", "cpu", "--output", str(out), "--in-process",
                        "--work", str(tmp_path / "work")]) == 0
    steps = _report(out)["steps"]
    assert list(steps) == ["1", "3", "4"] and all(step["status"] == "passed" for step in steps.values())
    assert [row[0] for row in steps["3"]["tables"][0]["rows"]] == ["none", "kerple_log", "alibi", "rpe", "kerple_bias_wht"]
    compiled = {row[0] for row in steps["4"]["tables"][0]["rows"] if row[1] == "on"}
    assert compiled == {"none", "kerple_log"}
    measured = {row[0] for row in steps["4"]["tables"][0]["rows"] if row[1] == "off"}
    assert measured == {"none", "kerple_log", "alibi", "rpe"}
    first_case = next(report for report in written if "3" in report["steps"])
    assert len(first_case["steps"]["3"]["tables"][0]["rows"]) == 1  # written after the first case already
    assert sum("3" in report["steps"] and "4" not in report["steps"] for report in written) >= 5
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]


def test_profile_mode_reports_host_work_per_step(tmp_path: Path) -> None:
    """``--profile`` at tiny scale on a CPU: step 8 alone, both embeddings profiled (compiled cases
    left out: CUDA only), no host synchronization in a training step, one kernel table per case."""
    out = tmp_path / "profile"
    assert runner.main(["--profile", "--device", "cpu", "--output", str(out), "--in-process",
                        "--work", str(tmp_path / "work")]) == 0
    step = _report(out)["steps"]["8"]
    assert list(_report(out)["steps"]) == ["8"] and step["status"] == "passed"
    rows = {(row[0], row[1]): row for row in step["tables"][0]["rows"]}
    assert set(rows) == {("none", "off"), ("kerple_log", "off")}
    for label in ("none, compile off", "kerple_log, compile off"):
        case = step["metrics"][label]
        assert case["syncs"] == 0 and case["ops"] > 50 and case["step_ms"] > 0 and case["host_ms"] > 0
        assert case["gpu_busy"] is None and case["launches"] is None  # no CUDA here
    assert "compile is measured on CUDA only" in step["reason"]
    assert [table["title"] for table in step["tables"][1:]] == [
        "Top 20 CUDA kernels: none, compile off", "Top 20 CUDA kernels: kerple_log, compile off"]
    assert "| none | off | sdpa |" in (out / "report.md").read_text()
