"""The training and evaluation stages with stand-ins for train.py and evaluate.py: chunk records, the
FlexAttention fallback, failures named with their log, and evaluation resumed per length."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kerple.data import preprocess
from kerple.data.prepared import PreparedData
from kerple.jobs.process import StopRequest
from kerple.jobs.progress import Progress
from kerple.reproduce.cli import finish, run_stages
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.plan import TINY, Settings
from kerple.reproduce.report import Outputs
from kerple.reproduce.stages import (Context, StageFailed, checkpoint_step, choose_eval_tokens, evaluate, flex_failure,
                                     merge_parts, results_file, train)
from kerple.reproduce.state import State

# Stand-in interpreter: argv[1] is train.py or evaluate.py, then the run's YAML files and key=value overrides.
FAKE = """
import json, os, sys
from pathlib import Path
script, args = Path(sys.argv[1]).name, sys.argv[2:]
values = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
impl = values["attention_impl"]
if os.environ.get("FAKE_FLEX_FAILS") and impl in ("auto", "flex"):
    print("torch._inductor.exc.InductorError: No valid triton configs. OutOfMemoryError: out of resource")
    sys.exit(1)
if os.environ.get("FAKE_CRASH"):
    print("RuntimeError: CUDA error: an illegal memory access was encountered")
    sys.exit(1)
if script == "train.py":
    steps = int(values["train_iters"])
    Path(values["log_dir"]).mkdir(parents=True, exist_ok=True)
    for step in range(5, steps + 1, 5):  # the progress comes from metrics.jsonl: the printed 999 ms is not read
        print(f"step {step:>6}/{steps} | loss 1.0 | 1,000 tok/s | 999 ms/step | ETA 0:01", flush=True)
        with open(Path(values["log_dir"]) / "metrics.jsonl", "a") as metrics:
            metrics.write(json.dumps({"step": step, "train/lm_loss": 1.0, "train/tokens_per_s": 1000.0,
                                      "train/step_time_s": 0.01}) + "\\n")
    (Path(values["save"]) / f"global_step{steps}").mkdir(parents=True, exist_ok=True)
    (Path(values["save"]) / "latest").write_text(f"global_step{steps}")
else:
    lengths = [int(x) for x in flags["--eval-lengths"].split(",")]
    iteration = int((Path(flags["--load"]) / "latest").read_text().removeprefix("global_step"))
    doc = {"format": "kerple-eval-1", "complete": True,
           "run": {"pos_emb": values["attention_impl"], "dataset": "python", "seed": 1234,
                   "train_seq_length": int(values["seq_length"]), "iteration": iteration},
           "protocol": {"name": "nonoverlap", "num_tokens": int(flags["--num-tokens"]), "attention_window": None,
                        "attention_impl_per_length": {str(n): impl for n in lengths}},
           "environment": {"seconds": 1.0},
           "results": [{"length": n, "ppl": 10.0 + n / 1000, "loss": 2.3} for n in lengths]}
    Path(flags["--output"]).parent.mkdir(parents=True, exist_ok=True)
    Path(flags["--output"]).write_text(json.dumps(doc))
"""


@pytest.fixture
def context(tmp_path: Path) -> Context:
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\n{FAKE}")
    fake.chmod(0o755)
    settings = Settings(TINY, 20 * TINY.tokens_per_step, ("alibi",), tmp_path / "work")
    state = State(settings.work / "state.json", settings.fingerprint(), eval_tokens=1024)
    lines: list[str] = []
    return Context(settings, state, StopRequest(), Progress(settings.steps, settings.pos_embs), out=lines.append,
                   python=str(fake), env={key: value for key, value in os.environ.items() if not key.startswith("FAKE_")})


CORPUS = PreparedData("/data/python_text_document", "90,10,0", "/data/bpe.json", 320,
                {"train": {"tokens": 9000, "documents": 9}, "valid": {"tokens": 2000, "documents": 2}}, {})


def test_training_falls_back_to_sdpa_when_flex_fails_to_compile(context: Context) -> None:
    context.env["FAKE_FLEX_FAILS"] = "1"
    assert train(context, CORPUS, "alibi")
    record = context.state.runs["alibi"]
    assert "No valid triton configs" in (record.fallback or "")
    assert [(c.attention_impl, c.status, c.start_step, c.end_step) for c in record.chunks] == [
        ("auto", "failed", 0, 0), ("sdpa", "finished", 0, 20)]
    assert checkpoint_step(context.settings.work / "runs" / "alibi" / "checkpoints") == 20
    assert context.progress.done["alibi"] == 20 and context.progress.seconds_per_step == 0.01
    assert train(context, CORPUS, "alibi")  # finished: nothing runs
    assert len(record.chunks) == 2
    saved = json.loads(context.state.path.read_text())
    assert saved["runs"]["alibi"]["fallback"] == record.fallback


def test_other_failures_stop_with_the_log_named(context: Context) -> None:
    context.env["FAKE_CRASH"] = "1"
    with pytest.raises(StageFailed, match=r"training alibi failed \(exit 1\); last line: RuntimeError: CUDA error.*"
                                          r"alibi-train\.log"):
        train(context, CORPUS, "alibi")
    assert context.state.runs["alibi"].fallback is None


def test_evaluation_scores_only_missing_lengths_and_merges_them(context: Context) -> None:
    assert train(context, CORPUS, "alibi")
    parts = context.settings.work / "results" / "alibi.parts"
    parts.mkdir(parents=True)
    earlier = {"format": "kerple-eval-1", "complete": False,
               "run": {"pos_emb": "alibi", "dataset": "python", "seed": 1234, "train_seq_length": 16, "iteration": 20},
               "protocol": {"name": "nonoverlap", "num_tokens": 1024, "attention_window": None,
                            "attention_impl_per_length": {"16": "sdpa", "32": "sdpa"}},
               "environment": {"seconds": 5.0},
               "results": [{"length": 16, "ppl": 7.0, "loss": 1.9}, {"length": 32, "ppl": 6.5, "loss": 1.8}]}
    (parts / "1.json").write_text(json.dumps(earlier))  # a chunk that ended after two lengths
    stale = {**earlier, "run": {**earlier["run"], "iteration": 10}, "results": [{"length": 64, "ppl": 99.0}]}
    (parts / "0.json").write_text(json.dumps(stale))  # another checkpoint: ignored
    assert evaluate(context, CORPUS, "alibi")
    asked = json.loads((parts / "2.json").read_text())
    assert [row["length"] for row in asked["results"]] == [64, 128, 256, 512]
    final = json.loads(results_file(context.settings, "alibi").read_text())
    assert final["complete"] and [row["ppl"] for row in final["results"]][:3] == [7.0, 6.5, 10.064]
    assert final["environment"]["seconds"] == 6.0 and set(final["protocol"]["attention_impl_per_length"]) == {
        "16", "32", "64", "128", "256", "512"}
    assert "alibi" in context.progress.evaluated


def test_evaluation_after_a_training_fallback_uses_sdpa(context: Context) -> None:
    context.env["FAKE_FLEX_FAILS"] = "1"
    assert train(context, CORPUS, "alibi") and evaluate(context, CORPUS, "alibi")
    chunks = [c for c in context.state.runs["alibi"].chunks if c.kind == "evaluate"]
    assert [(c.attention_impl, c.status) for c in chunks] == [("sdpa", "finished")]


def test_nothing_starts_without_time_or_after_a_stop(context: Context) -> None:
    context.stop.count = 1
    assert not train(context, CORPUS, "alibi") and context.state.runs["alibi"].chunks == []


def test_merge_parts_without_parts(tmp_path: Path) -> None:
    assert merge_parts(tmp_path / "none", (16, 32), 20, 1024) is None


def test_scored_tokens_are_whole_windows_of_the_longest_length() -> None:
    settings = Settings(TINY, 7680, ("alibi",), Path("w"))  # longest length 512
    assert choose_eval_tokens(settings, CORPUS) == 1536  # (2000 - 1) // 512 * 512
    small = PreparedData("p", "s", "t", 320, {"valid": {"tokens": 500, "documents": 1}}, {})
    with pytest.raises(ReproduceError, match="holds 500 tokens, fewer than one window of 512"):
        choose_eval_tokens(settings, small)


def test_checkpoint_step_and_flex_failure_lines(tmp_path: Path) -> None:
    assert checkpoint_step(tmp_path) == 0
    (tmp_path / "global_step1200").mkdir()
    (tmp_path / "latest").write_text("global_step1200\n")
    assert checkpoint_step(tmp_path) == 1200
    assert flex_failure(["step 1", "torch._dynamo.exc.BackendCompilerFailed: backend='inductor'", "exit"]) == (
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor'")
    assert flex_failure(["RuntimeError: CUDA out of memory"]) is None


def test_every_run_is_trained_then_evaluated_in_order_and_reported(context: Context, tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    for i in range(20):
        body = "".join(f"    value_{j} = compute({i}, {j}) + offset_{j % 7}\n" for j in range(40))
        (root / f"module_{i}.py").write_text(f"def function_{i}(argument):\n{body}    return argument\n")
    settings = Settings(TINY, 20 * TINY.tokens_per_step, ("kerple_log", "rotary"), context.settings.work)
    preprocess.run(["python", "--root", str(root), "-d", str(settings.work / "data"), "--train-tokenizer", "300",
                    "--split", TINY.split, "--quiet"])
    state = State(settings.work / "state.json", settings.fingerprint())
    lines: list[str] = []
    ctx = Context(settings, state, StopRequest(), Progress(settings.steps, settings.pos_embs), out=lines.append,
                  python=context.python, env=context.env)
    corpus, failure = run_stages(ctx)
    assert failure is None and corpus is not None
    assert state.eval_tokens == (corpus.tokens("valid") - 1) // 512 * 512 > 0  # whole windows of the longest length
    order = [(name, chunk.kind) for name, record in state.runs.items() for chunk in record.chunks]
    assert order == [("kerple_log", "train"), ("kerple_log", "evaluate"), ("rotary", "train"), ("rotary", "evaluate")]
    outputs = Outputs(tmp_path / "page.md", tmp_path / "images" / "plot.png", None)
    assert finish(ctx, corpus, outputs, None) == 0
    assert "| Extrp. | KERPLE (log) | Rotary |" in outputs.page.read_text()
    assert any(line.startswith("done: kerple_log, rotary trained and evaluated") for line in lines)
