"""The lease preset: the sizing rule, where the throughput comes from, its refusals, the output folder,
and corpus -> probe -> sizing -> runs -> report with stand-ins for train.py and evaluate.py."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from kerple.jobs.process import StopRequest
from kerple.jobs.progress import Progress
from kerple.reproduce.cli import main
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.lease import (LEASE_SCALES, LeaseOptions, LeasePlan, check_minutes, least_minutes, lease_scale,
                                    probe_rate, read_throughput_report, seconds_needed, size_steps, with_overrides)
from kerple.reproduce.lease_report import check_output, output_problems
from kerple.reproduce.lease_run import prepare, run_all, start_state
from kerple.reproduce.plan import FULL, TINY
from kerple.reproduce.stages import Context
from kerple.reproduce.state import State

# Stand-in interpreter: `-m kerple.reproduce.corpus ...` runs the real one; train.py and evaluate.py are faked.
FAKE = """
import json, os, sys
from pathlib import Path
if sys.argv[1] == "-m":
    os.execv(os.environ["REAL_PYTHON"], [os.environ["REAL_PYTHON"], *sys.argv[1:]])
script, args = Path(sys.argv[1]).name, sys.argv[2:]
values = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
if script == "train.py":
    steps = int(values["train_iters"])
    Path(values["log_dir"]).mkdir(parents=True, exist_ok=True)
    for step in range(5, steps + 1, 5):  # what the trainer records; its printed line says otherwise (ignored)
        print(f"step {step:>6}/{steps} | loss 1.0 | 7 tok/s | 10 ms/step", flush=True)
        with open(Path(values["log_dir"]) / "metrics.jsonl", "a") as metrics:
            metrics.write(json.dumps({"step": step, "train/lm_loss": 1.0, "train/tokens_per_s": 1000 if step > 5 else 10,
                                      "train/step_time_s": 0.01}) + "\\n")
    if values["save"]:
        (Path(values["save"]) / f"global_step{steps}").mkdir(parents=True, exist_ok=True)
        (Path(values["save"]) / "latest").write_text(f"global_step{steps}")
else:
    lengths = [int(x) for x in flags["--eval-lengths"].split(",")]
    iteration = int((Path(flags["--load"]) / "latest").read_text().removeprefix("global_step"))
    doc = {"format": "kerple-eval-1", "complete": True,
           "run": {"pos_emb": "x", "dataset": "python", "seed": 1234, "train_seq_length": 16, "iteration": iteration},
           "protocol": {"name": "nonoverlap", "num_tokens": int(flags["--num-tokens"]), "attention_window": None,
                        "attention_impl_per_length": {str(n): "sdpa" for n in lengths}},
           "environment": {"seconds": 1.0},
           "results": [{"length": n, "ppl": 10.0 + n / 1000, "loss": 2.3} for n in lengths]}
    Path(flags["--output"]).parent.mkdir(parents=True, exist_ok=True)
    Path(flags["--output"]).write_text(json.dumps(doc))
"""


def gpu_check_report(path: Path, rates: dict[str, float]) -> Path:
    """A report.json of the GPU check's shape, with step 4's best tokens/s per embedding."""
    path.write_text(json.dumps({"environment": {"device": "NVIDIA H100"},
                                "steps": {"4": {"metrics": {"best_tokens_per_s": rates, "best_mfu": {}}}}}))
    return path


def error_line(capsys: pytest.CaptureFixture) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_reproduce.py: error: "), lines
    return lines[0]


# --- the sizing rule ----------------------------------------------------------------------------------------

def test_steps_fill_the_budget_left_after_every_runs_overhead() -> None:
    # 540 s, two runs at 400k tokens/s and two at 500k, overheads 110 + 110 + 40 + 40 = 300 s, batch 32 x 512:
    # one step of all four runs takes 2 x 16384/400000 + 2 x 16384/500000 = 0.147456 s; 0.9 x 240 / 0.147456 = 1464.8
    assert size_steps(540.0, [4e5, 4e5, 5e5, 5e5], 16384, [110.0, 110.0, 40.0, 40.0], safety=0.9) == 1464
    assert size_steps(250.0, [4e5], 16384, [300.0]) == 0  # the overheads alone do not fit
    for steps in (1, 100, 1464):
        assert size_steps(seconds_needed(steps, [4e5, 5e5], 16384, [90.0, 30.0]) + 1e-9, [4e5, 5e5], 16384,
                          [90.0, 30.0]) == steps
    with pytest.raises(ValueError):
        size_steps(100.0, [0.0], 16384, [1.0])


def test_too_few_minutes_are_refused_with_the_least_that_fits() -> None:
    lease, kernels = LEASE_SCALES["full"], {"kerple_log": "sdpa", "rotary": "sdpa"}
    eval_kernels = {"kerple_log": "flex", "rotary": "sdpa"}
    with pytest.raises(ReproduceError, match=r"--minutes 2 is below what the lease needs for 2 run\(s\): .*"
                                             r"give --minutes \d+(\.\d+)? or more, or fewer --pos-emb, or "
                                             "--throughput-report to skip the probe"):
        check_minutes(2.0, FULL, lease, kernels, eval_kernels, None)
    check_minutes(5.0, FULL, lease, kernels, eval_kernels, None)
    # the least minutes hold the fixed seconds beside the corpus share (20%, at most 120 s), in quarter minutes
    assert least_minutes(240.0, lease) == 5.0 and least_minutes(1000.0, lease) == 18.75


# --- where the throughput comes from --------------------------------------------------------------------------

def test_the_gpu_checks_report_gives_tokens_per_s_per_embedding(tmp_path: Path) -> None:
    path = gpu_check_report(tmp_path / "report.json", {"kerple_log": 450_000.0, "none": 520_000.0, "alibi": 440_000.0})
    throughput = read_throughput_report(path, ("kerple_log", "rotary", "none"))
    assert throughput.tokens_per_s == {"kerple_log": 450_000.0, "rotary": 440_000.0, "none": 520_000.0}
    assert str(path) in throughput.source and "rotary not in it: its slowest rate" in throughput.source


@pytest.mark.parametrize("text, reason", [
    (None, "No such file or directory"),
    ("{not json", "not JSON"),
    (json.dumps({"steps": {"3": {}}}), "no positive tokens/s per embedding"),
    (json.dumps({"steps": {"4": {"metrics": {"best_tokens_per_s": {"none": -1}}}}}), "no positive tokens/s"),
])
def test_a_missing_or_malformed_report_is_refused_naming_it(tmp_path: Path, text: str | None, reason: str) -> None:
    path = tmp_path / "report.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ReproduceError, match=rf"--throughput-report {path}: .*{reason}"):
        read_throughput_report(path, ("none",))


def test_an_earlier_leases_report_gives_its_measurements(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"format": "kerple-reproduce-lease-1", "measured": {
        "tokens_per_s": {"kerple_log": 300_000.0}, "train_start_s": {"flex": 38.5}, "eval_s": {"flex": 41.0}}}))
    throughput = read_throughput_report(path, ("kerple_log",))
    assert throughput.tokens_per_s == {"kerple_log": 300_000.0} and "earlier lease" in throughput.source
    assert throughput.start_s == {"flex": 38.5} and throughput.eval_s == {"flex": 41.0}


def test_the_probe_reads_the_windows_after_the_first() -> None:
    records = [{"step": step, "train/lm_loss": 1.0, "train/tokens_per_s": rate}
               for step, rate in ((10, 2_000.0), (20, 40_000.0), (30, 42_000.0), (40, 41_000.0))]
    records.insert(2, {"step": 25, "train/lm_loss": 1.0, "train/tokens_per_s": float("nan")})
    assert probe_rate(records, 10) == 41_000.0 and probe_rate(records[:1], 10) is None
    assert with_overrides(["a.yml", "save=/x", "lr=1"], {"save": "", "load": ""}) == ["a.yml", "lr=1", "save=", "load="]


# --- the output folder --------------------------------------------------------------------------------------

def test_the_output_folder_holds_only_the_report(tmp_path: Path) -> None:
    work = tmp_path / "work"
    with pytest.raises(ReproduceError, match="--output .* is inside the work folder"):
        check_output(work / "out", work)
    with pytest.raises(ReproduceError, match="--work .* is inside --output"):
        check_output(tmp_path, work)
    output = tmp_path / "out"
    output.mkdir()
    (output / "report.md").write_text("old")
    (output / ".report.json.abc.tmp").write_text("{")  # a write that was killed
    check_output(output, work)
    assert sorted(path.name for path in output.iterdir()) == ["report.md"]
    (output / "mine.txt").write_text("x")
    with pytest.raises(ReproduceError, match=r"holds other files \(mine.txt\)"):
        check_output(output, work)
    deep = output / "a" / "b" / "c"
    deep.mkdir(parents=True)
    for index in range(8):
        (output / f"{index}.txt").write_text("x")
    (deep / "file").write_text("x")
    assert output_problems(output) == ["11 files (at most 8)", "a/b/c/file: 3 folders deep (at most 2)"]


@pytest.mark.parametrize("argv, message", [
    (["--preset", "fast"], "--preset 'fast': choose chunks"),
    (["--output", "OUT"], "--output is for --preset lease; add --preset lease, or drop --output"),
    (["--preset", "lease"], "--preset lease needs --output DIR"),
    (["--preset", "lease", "--output", "OUT", "--tokens", "1M"], "--tokens is for the chunked preset"),
    (["--preset", "lease", "--output", "OUT", "--minutes", "0"], "--minutes 0: the lease sizes its runs"),
    (["--preset", "lease", "--output", "OUT", "--corpus-tokens", "lots"], "--corpus-tokens 'lots': expected a count"),
    (["--preset", "lease", "--output", "OUT", "--minutes", "0.5"], "--minutes 0.5 is below what the lease needs"),
    (["--preset", "lease", "--output", "OUT", "--throughput-report", "NONE.json"],
     "--throughput-report NONE.json: No such file or directory"),
])
def test_bad_lease_options(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    argv = [arg.replace("OUT", str(tmp_path / "out")).replace("NONE.json", str(tmp_path / "none.json")) for arg in argv]
    message = message.replace("NONE.json", str(tmp_path / "none.json"))
    assert main(["--scale", "tiny", "--work", str(tmp_path / "work"), *argv]) == 2
    assert message in error_line(capsys) and not (tmp_path / "work").exists()


# --- the flow, with stand-in children ----------------------------------------------------------------------

@pytest.fixture
def lease_context(tmp_path: Path) -> tuple[Context, LeaseOptions]:
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\n{FAKE}")
    fake.chmod(0o755)
    root = tmp_path / "src"
    root.mkdir()
    for i in range(30):
        body = "".join(f"    value_{j} = compute({i}, {j}) + offset_{j % 7}\n" for j in range(60))
        (root / f"module_{i}.py").write_text(f"def function_{i}(argument):\n{body}    return argument\n")
    lease = LEASE_SCALES["tiny"]
    options = LeaseOptions(lease, lease_scale(TINY, lease), ("kerple_log", "rotary"), tmp_path / "work",
                           tmp_path / "out", 10.0, 20_000, (str(root),))
    settings = options.settings(1)
    state = State(settings.work / "state.json", settings.fingerprint(), device="CPU")
    deadline = time.monotonic() + 600.0
    env = {**os.environ, "REAL_PYTHON": sys.executable}
    ctx = Context(settings, state, StopRequest(), Progress(1, settings.pos_embs), deadline, env, out=lambda line: None,
                  python=str(fake))
    return ctx, options


def test_corpus_probe_sizing_then_every_run_in_order(lease_context: tuple[Context, LeaseOptions]) -> None:
    ctx, options = lease_context
    written: list[object] = []
    corpus, plan = prepare(ctx, options, None, None, lambda corpus=None: written.append(corpus))
    assert corpus is not None and plan is not None and written == [corpus]
    assert corpus.source["cap"]["stopped_by"] == "cap" and 20_000 <= sum(corpus.tokens(p) for p in corpus.parts)
    assert plan.tokens_per_s == {"kerple_log": 1000.0, "rotary": 1000.0} and "probe of kerple_log" in \
        plan.throughput_source
    overheads = [plan.overhead_s(name) for name in options.pos_embs]
    assert plan.steps == size_steps(plan.budget_s, [1000.0, 1000.0], TINY.tokens_per_step, overheads) > 0
    assert ctx.settings.steps == plan.steps and json.loads(ctx.state.path.read_text())["lease"]["steps"] == plan.steps
    run_all(ctx, corpus, plan, lambda: written.append(None))
    order = [(name, chunk.kind) for name, record in ctx.state.runs.items() for chunk in record.chunks]
    assert order == [("kerple_log", "train"), ("kerple_log", "evaluate"), ("rotary", "train"), ("rotary", "evaluate")]
    assert len(written) == 5  # the corpus, then after every training and every evaluation


def test_a_run_that_cannot_finish_in_the_time_left_is_skipped(lease_context: tuple[Context, LeaseOptions]) -> None:
    ctx, options = lease_context
    corpus, plan = prepare(ctx, options, None, None, lambda corpus=None: None)
    assert corpus is not None and plan is not None
    plan.tokens_per_s["kerple_log"] = 1e-3  # its steps would take years
    run_all(ctx, corpus, plan, lambda: None)
    assert "kerple_log" not in ctx.state.runs and ctx.state.runs["rotary"].count("evaluate") == 1
    assert LeasePlan(**ctx.state.lease).notes[0].startswith("kerple_log not run: its training needs about")


def test_a_second_command_keeps_the_sized_steps(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lease, work = LEASE_SCALES["tiny"], tmp_path / "work"
    options = LeaseOptions(lease, lease_scale(TINY, lease), ("alibi",), work, tmp_path / "out", 2.0, 50_000)
    plan = LeasePlan(minutes=2.0, steps=30, tokens_per_s={"alibi": 900.0}, throughput_source="a probe",
                     kernels={"alibi": "sdpa"}, eval_kernels={"alibi": "sdpa"}, start_s={"alibi": 9.0},
                     eval_s={"alibi": 8.0}, checkpoint_s=0.5, report_s=1.0, budget_s=80.0, safety=0.9,
                     corpus_tokens=50_000, eval_token_cap=2048)
    State(work / "state.json", options.settings(30).fingerprint(), lease=asdict(plan)).save()
    state, kept = start_state(options)
    assert kept == plan and state.fingerprint["steps"] == 30
    argv = ["--scale", "tiny", "--preset", "lease", "--pos-emb", "alibi", "--work", str(work), "--output",
            str(tmp_path / "out")]
    assert main([*argv, "--corpus-tokens", "40k"]) == 2
    assert "was started with other settings (corpus_tokens 50000 -> 40000)" in error_line(capsys)
    State(work / "state.json", replace(options, corpus_tokens=None).settings(30).fingerprint()).save()  # chunked
    assert main([*argv, "--corpus-tokens", "50k"]) == 2
    assert "was started with other settings (corpus_tokens None -> 50000)" in error_line(capsys)
