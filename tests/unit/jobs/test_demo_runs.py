"""The demos' runner: progress from the trainings' metrics.jsonl, their lines echoed, a failure one line;
and the one evaluate.py command."""

from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path

import pytest

from kerple.jobs.demo_runs import Runner, evaluate_command, metrics_file
from kerple.jobs.process import ChildFailed

# A stand-in train.py: records steps 10 and 20 where the trainer would, prints a line that says otherwise.
FAKE_TRAIN = """
import json, sys
from pathlib import Path
log_dir = Path([a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("log_dir=")][0])
log_dir.mkdir(parents=True, exist_ok=True)
for step in (10, 20):
    with open(log_dir / "metrics.jsonl", "a") as metrics:
        metrics.write(json.dumps({"step": step, "train/lm_loss": 1.0}) + "\\n")
print("step      3/20 | loss 1.0", flush=True)
print("noise that is not shown", flush=True)
sys.exit(int(sys.argv[-1]))
"""


def test_the_bar_follows_metrics_jsonl_not_the_printed_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "train.py"
    script.write_text(FAKE_TRAIN)
    log_dir = tmp_path / "run" / "logs"
    (log_dir).mkdir(parents=True)
    (log_dir / "metrics.jsonl").write_text(json.dumps({"step": 400, "train/lm_loss": 1.0}) + "\n")  # an older run's
    command = [sys.executable, str(script), "tiny.yml", f"log_dir={log_dir}", "0"]
    assert metrics_file(command) == log_dir / "metrics.jsonl"
    runner = Runner(total_steps=40, threads=1)
    runner.run("alibi", [command])
    assert runner.bar.n == 20
    runner.close()
    shown = capsys.readouterr().out
    assert "[alibi] step      3/20" in shown and "noise" not in shown
    with pytest.raises(ChildFailed, match=r"^\[alibi\] train.py exited with status 3: noise that is not shown$"):
        Runner(total_steps=20, threads=1).run("alibi", [[*command[:-1], "3"]])


def test_models_side_by_side_feed_one_bar_and_a_failure_stops_the_job(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "train.py"
    script.write_text(FAKE_TRAIN)
    jobs = {name: [[sys.executable, str(script), f"log_dir={tmp_path / name}", "0"]] for name in ("alibi", "rotary")}
    with closing(Runner(total_steps=40, threads=1)) as runner:
        runner.run_many(jobs, workers=2)
        assert runner.bar.n == 40  # 20 steps recorded by each model
    shown = capsys.readouterr().out
    assert "[alibi] step      3/20" in shown and "[rotary] step      3/20" in shown
    failing = {**jobs, "rotary": [[*jobs["rotary"][0][:-1], "3"]]}
    with pytest.raises(ChildFailed, match=r"^\[rotary\] train.py exited with status 3: "):
        Runner(total_steps=40, threads=1).run_many(failing, workers=2)


def test_one_evaluate_command() -> None:
    command = evaluate_command(["a.yml", "lr=1"], "out/x.json", [64, 128], 512, "--attention-impl", "sdpa")
    assert command[1:] == ["evaluate.py", "a.yml", "lr=1", "--attention-impl", "sdpa", "--eval-lengths", "64,128",
                           "--protocol", "nonoverlap", "--num-tokens", "512", "--no-progress", "--output", "out/x.json"]
    assert metrics_file(command) is None


def test_written_files_are_shown_relative_to_the_repository_only_when_inside_it(tmp_path) -> None:
    from kerple.jobs.demo_runs import ROOT, shown_path

    assert shown_path(ROOT / "results" / "demo" / "extension.md") == "results/demo/extension.md"
    assert shown_path(tmp_path / "extension.md") == str(tmp_path / "extension.md")  # relative_to raised here
