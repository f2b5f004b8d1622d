"""`make gpu-reproduce --scale tiny` end to end on a CPU: corpus, chunked training, evaluation, report.

The first run is stopped by SIGTERM while the model trains (as at the end of a GPU session); the
second run of the same command resumes it from its checkpoint instead of restarting it, evaluates it
and writes the Table-3 report. The lease preset runs once, sized from a GPU-check report, and must
leave only its report in --output, as a lease returns it. The numbers are not tested; several runs
in order are tested with stand-in children in tests/unit/reproduce/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

from kerple.reproduce.lease import size_steps
from kerple.reproduce.lease_report import REPORT_FILES, output_problems
from kerple.reproduce.report import BEGIN, END

REPO = Path(__file__).resolve().parents[2]
STEPS = 120  # tokens 15,360 / (8 x 16 per step)


def source_files(root: Path) -> None:
    """24 small standard-library modules, and one of them again under another name."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chosen = sorted(path for path in stdlib.glob("*.py") if 1500 < path.stat().st_size < 6000)[:24]
    for path in chosen:
        shutil.copy(path, root / path.name)
    (root / "vendored").mkdir()
    shutil.copy(chosen[0], root / "vendored" / "copy.py")


def test_tiny_reproduction_stops_resumes_and_reports(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    source_files(root)
    work, page, readme = tmp_path / "work", tmp_path / "docs" / "reproduce.md", tmp_path / "README.md"
    readme.write_text(f"# Project\n{BEGIN}\n{END}\nrest\n")
    command = [sys.executable, "tools/gpu_reproduce.py", "--scale", "tiny", "--tokens", str(STEPS * 128),
               "--pos-emb", "kerple_log", "--work", str(work), "--root", str(root), "--docs", str(page),
               "--readme", str(readme)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        lines = []
        for line in first.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if re.search(rf"\[kerple_log\] step\s+10/{STEPS}\b", line):
                first.send_signal(signal.SIGTERM)  # to the command only; it stops its trainer
        first.wait(timeout=120)
    finally:
        try:
            os.killpg(first.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    output = "".join(lines)
    assert first.returncode == 0, output[-3000:]
    assert "stopped on request with 0 of 1 runs evaluated; run the same command again" in output
    stopped_at = int((work / "runs" / "kerple_log" / "checkpoints" / "latest").read_text().removeprefix("global_step"))
    assert 10 <= stopped_at < STEPS and not (work / "results").exists()
    assert "**Status:** in progress: 0 of 1" in page.read_text() and "| 512 | pending |" in page.read_text()

    info = json.loads((work / "data" / "python" / "python_text_document.info.json").read_text())
    assert info["source"]["files_found"] == 25 and info["source"]["duplicates_removed"] == 1
    assert info["parts"]["train"]["documents"] + info["parts"]["valid"]["documents"] == 24

    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-3000:]
    assert f"training kerple_log: resuming at step {stopped_at} of {STEPS}" in output
    assert "corpus: preparing" not in output and "done: kerple_log trained and evaluated" in output
    steps = [json.loads(line)["step"] for line in (work / "runs" / "kerple_log" / "logs" / "metrics.jsonl").open()
             if "train/lm_loss" in line]
    assert steps == sorted(set(steps)) and steps[0] == 5 and steps[-1] == STEPS  # continued, never restarted
    state = json.loads((work / "state.json").read_text())
    chunks = [(c["start_step"], c["end_step"], c["status"]) for c in state["runs"]["kerple_log"]["chunks"]
              if c["kind"] == "train"]
    assert chunks == [(0, stopped_at, "stopped"), (stopped_at, STEPS, "finished")]
    results = json.loads((work / "results" / "kerple_log.json").read_text())
    assert results["complete"] and [row["length"] for row in results["results"]] == [16, 32, 64, 128, 256, 512]
    assert results["protocol"]["name"] == "nonoverlap" and results["run"]["iteration"] == STEPS
    section = readme.read_text().split(BEGIN)[1].split(END)[0]
    assert "**Status:** complete: 1 of 1 runs" in section and "pending" not in section
    assert "| Extrp. | KERPLE (log) |" in section and all(f"\n| {n} | " in section for n in (16, 512))
    # on a CPU, `auto` trains a bias with sdpa and evaluates below 2048 tokens with sdpa (README, attention table)
    assert f"| KERPLE (log) | sdpa / sdpa | {STEPS} of {STEPS} | " in section
    assert readme.read_text().endswith(f"{END}\nrest\n")
    plot = page.parent / "images" / "reproduce_tiny_ppl_vs_length.png"
    assert plot.read_bytes()[:4] == b"\x89PNG" and "## Against the paper's Table 3" in page.read_text()


def test_tiny_lease_sizes_its_runs_and_returns_only_its_report(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    source_files(root)
    work, output, check = tmp_path / "work", tmp_path / "out" / "reproduce", tmp_path / "gpu-report.json"
    check.write_text(json.dumps({"steps": {"4": {"metrics": {"best_tokens_per_s": {"kerple_log": 1000.0,
                                                                                 "rotary": 1000.0}}}}}))
    command = [sys.executable, "tools/gpu_reproduce.py", "--scale", "tiny", "--preset", "lease", "--minutes", "2.5",
               "--pos-emb", "kerple_log,rotary", "--work", str(work), "--root", str(root), "--output", str(output),
               "--throughput-report", str(check)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-3000:]
    assert "done: kerple_log, rotary trained and evaluated" in text
    assert sorted(path.name for path in output.rglob("*")) == sorted(REPORT_FILES) and output_problems(output) == []
    page = (output / "report.md").read_text()
    assert f"- **Throughput assumed**: 1,000 tokens/s for every run, from {check} (the GPU check's step 4" in page
    assert "| 512 | " in page and "pending" not in page.split("## Perplexity")[1].split("## Time")[0]
    report = json.loads((output / "report.json").read_text())
    plan = report["plan"]
    overheads = [plan["start_s"][n] + plan["checkpoint_s"] + plan["eval_s"][n] + 2 * plan["report_s"]
                 for n in ("kerple_log", "rotary")]
    assert report["steps"] == plan["steps"] == size_steps(plan["budget_s"], [1000.0, 1000.0], 128, overheads) >= 20
    assert all(len(report["runs"][name]["ppl"]) == 6 for name in ("kerple_log", "rotary"))
    assert set(report["measured"]["tokens_per_s"]) == {"kerple_log", "rotary"}
    assert report["corpus"]["cap"]["stopped_by"] in ("cap", "sources") and report["eval_tokens"] <= 2048
    assert "== kerple_log-train.log" in (output / "logs.txt").read_text()
    assert (work / "runs" / "rotary" / "checkpoints" / "latest").is_file()  # the work stays outside --output
