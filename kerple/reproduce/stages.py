"""The stages of a reproduction, each one of the project's entry points in a child process.

* corpus: ``prepare_data.py python --train-tokenizer V`` (once; skipped when its ``info.json`` exists);
* training: ``train.py`` with the run's config, ``load`` = ``save``, so every chunk resumes from the
  last checkpoint; a chunk ends when the trainer is asked to stop (``SIGTERM``: it saves) before the
  deadline, and a periodic checkpoint every ``save_interval`` steps bounds what a lost machine costs;
* evaluation: ``evaluate.py`` for the lengths not yet scored (it writes its results after every
  length), into numbered part files that are merged into ``results/<pos_emb>.json``; every part
  scores the same tokens at every length (``--num-tokens`` fixed when the corpus is ready), so the
  lengths of several parts form one Table-3 column.

When a child using FlexAttention fails before its first checkpoint or result with a compiler error,
the run switches to ``sdpa`` (materialized bias, slower, same numbers) and says why in the report.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerple.atomic import write_json_atomic
from kerple.data.prepared import PreparedData
from kerple.jobs.process import Outcome, StopRequest, run_child
from kerple.jobs.progress import MetricsFollower, Progress
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.plan import REPO, SOURCE, Settings, config_arguments, run_folder
from kerple.reproduce.state import Chunk, State

FLEX_FAILURE = re.compile(r"No valid triton configs|out of resource|BackendCompilerFailed|InductorError|"
                          r"flex_attention|FlexAttention", re.IGNORECASE)
EVAL_GRACE_S = 10.0
OVERRIDE_LOG = re.compile(r"^\S+: .+ \(.+\) -> .+ \(.+\)$")  # `key: old (file) -> new (file)`, in the log only


class StageFailed(RuntimeError):
    """A child process failed for a reason other than a stop request (its log says why)."""


@dataclass
class Context:
    """What every stage needs: the settings, the record, stop requests, the deadline, the output."""

    settings: Settings
    state: State
    stop: StopRequest
    progress: Progress
    deadline: float | None = None  # time.monotonic() value at which this chunk must have ended
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    out: Callable[[str], None] = print
    python: str = sys.executable

    def time_left(self) -> float:
        """Seconds this chunk may still spend on its stages (the report's time kept aside)."""
        if self.deadline is None:
            return float("inf")
        return self.deadline - self.settings.scale.report_s - time.monotonic()

    @property
    def stage_deadline(self) -> float | None:
        """When the stages must have ended: the chunk's deadline less the report's time."""
        return None if self.deadline is None else self.deadline - self.settings.scale.report_s

    def log(self, name: str) -> Path:
        return self.settings.work / "logs" / f"{name}.log"


def detect_device(settings: Settings) -> str:
    """The device's name: the tiny scale runs on the CPU; the full scale refuses to start without CUDA.
    CUDA is queried in a child process, so this process never holds GPU memory of its own."""
    if not settings.scale.needs_cuda:
        return "CPU"
    query = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    name = subprocess.run([sys.executable, "-c", query], capture_output=True, text=True).stdout.strip()
    if not name:
        raise ReproduceError("--scale full trains 162M-parameter models and needs a CUDA GPU (torch sees none); "
                             "on a CPU, check the orchestration with --scale tiny (make gpu-reproduce SCALE=tiny)")
    return name.splitlines()[-1]


def flex_failure(lines: list[str]) -> str | None:
    """The line of a child's output that shows FlexAttention failing to compile, if any."""
    return next((line.strip()[:300] for line in reversed(lines) if FLEX_FAILURE.search(line)), None)


def echo_lines(ctx: Context, name: str) -> Callable[[str], None]:
    def on_line(line: str) -> None:
        if not OVERRIDE_LOG.match(line):
            ctx.out(f"[{name}] {line}")
    return on_line


def follow_progress(ctx: Context, pos_emb: str) -> Callable[[], None]:
    """An ``on_tick`` reading ``pos_emb``'s ``metrics.jsonl`` into the progress line, printed when due."""
    follower = MetricsFollower(run_folder(ctx.settings, pos_emb) / "logs" / "metrics.jsonl")

    def tick() -> None:
        if ctx.progress.observe(pos_emb, follower.poll()) and ctx.progress.due():
            ctx.out(ctx.progress.line())
    return tick


def stage_failure(what: str, outcome: Outcome, log: Path) -> StageFailed:
    last = next((line for line in reversed(outcome.tail) if line.strip()), "no output")
    return StageFailed(f"{what} failed (exit {outcome.returncode}); last line: {last.strip()[:300]} (log: {log})")


# --- corpus -----------------------------------------------------------------------------------

def corpus_prefix(settings: Settings) -> Path:
    return settings.work / "data" / SOURCE / f"{SOURCE}_text_document"


def ensure_corpus(ctx: Context) -> PreparedData | None:
    """The prepared corpus, preparing it first when needed; ``None`` if stopped meanwhile."""
    from kerple.data.indexed_dataset import dataset_exists

    settings, prefix = ctx.settings, corpus_prefix(ctx.settings)
    info = Path(f"{prefix}.info.json")
    if info.is_file() and dataset_exists(prefix):
        return PreparedData.from_info(info)
    scale = settings.scale
    workers = 1 if scale.name == "tiny" else max(1, (os.cpu_count() or 2) - 1)
    command = [ctx.python, REPO / "prepare_data.py", SOURCE, "-d", settings.work / "data", "--train-tokenizer",
               str(scale.vocab), "--split", scale.split, "--workers", str(workers), "--quiet"]
    command += ["--limit", str(scale.file_limit)] if scale.file_limit else []
    for root in settings.roots:
        command += ["--root", root]
    ctx.out(f"corpus: preparing the Python sources on this machine ({workers} worker(s)); this runs once")
    outcome = run_child(command, log_path=ctx.log("corpus"), stop=ctx.stop, on_line=echo_lines(ctx, "corpus"),
                        env=ctx.env)
    if outcome.stopped:
        return None
    if not outcome.ok or not info.is_file():
        raise stage_failure("prepare_data.py", outcome, ctx.log("corpus"))
    ctx.state.corpus_seconds = outcome.seconds
    ctx.state.save()
    return PreparedData.from_info(info)


def choose_eval_tokens(settings: Settings, corpus: PreparedData) -> int:
    """Scored tokens per length: the validation split, rounded down to whole windows of the longest
    length (so every length scores the same tokens, KERPLE §5.2), at most the scale's cap."""
    longest = settings.scale.lengths[-1]
    stream = corpus.tokens("valid")
    total = (stream - 1) // longest * longest
    if settings.scale.eval_token_cap is not None:
        total = min(total, settings.scale.eval_token_cap // longest * longest)
    if total < longest:
        raise ReproduceError(f"the validation split holds {stream:,} tokens, fewer than one window of {longest:,} "
                             "plus its label: give more source files (--root), or delete the corpus to rebuild it")
    return total


# --- training ---------------------------------------------------------------------------------

def checkpoint_step(folder: Path) -> int:
    """The step of the checkpoint ``latest`` names in ``folder`` (0 when there is none)."""
    from kerple.checkpoint.files import latest_tag, trailing_step  # kerple.checkpoint loads torch: only here

    tag = latest_tag(folder)
    return (trailing_step(tag) or 0) if tag else 0


def train(ctx: Context, corpus: PreparedData, pos_emb: str) -> bool:
    """Train ``pos_emb`` until it is finished (True) or this chunk ends (False)."""
    settings, scale = ctx.settings, ctx.settings.scale
    folder, record = run_folder(settings, pos_emb) / "checkpoints", ctx.state.run(pos_emb)
    start = checkpoint_step(folder)
    ctx.progress.done[pos_emb] = start
    while start < settings.steps:
        if ctx.stop.requested or ctx.time_left() - scale.stop_margin_s < scale.min_train_s:
            return False
        impl = record.impl("train", settings.attention_impl)
        ctx.out(f"training {pos_emb}: {'resuming at' if start else 'starting at'} step {start:,} of "
                f"{settings.steps:,} (attention_impl {impl})")
        command = [ctx.python, REPO / "train.py", *config_arguments(settings, corpus, pos_emb, impl)]
        outcome = run_child(command, log_path=ctx.log(f"{pos_emb}-train"), stop=ctx.stop,
                            deadline=ctx.stage_deadline, margin=scale.stop_margin_s, grace=scale.stop_margin_s,
                            on_line=echo_lines(ctx, pos_emb), on_tick=follow_progress(ctx, pos_emb), env=ctx.env)
        end = checkpoint_step(folder)
        status = "finished" if end >= settings.steps else "stopped" if outcome.ok or outcome.stopped else "failed"
        record.chunks.append(Chunk("train", outcome.seconds, start, end, impl, status))
        ctx.state.save()
        ctx.progress.done[pos_emb] = end
        if status != "failed":
            return end >= settings.steps
        reason = flex_failure(outcome.tail)
        if end > start or reason is None or impl == "sdpa":
            raise stage_failure(f"training {pos_emb}", outcome, ctx.log(f"{pos_emb}-train"))
        record.fallback = reason
        ctx.state.save()
        ctx.out(f"training {pos_emb}: FlexAttention failed ({reason}); continuing with attention_impl sdpa")
    return True


# --- evaluation -------------------------------------------------------------------------------

def results_file(settings: Settings, pos_emb: str) -> Path:
    return settings.work / "results" / f"{pos_emb}.json"


def evaluated(settings: Settings) -> list[str]:
    """The runs scored at every length, in order."""
    def complete(path: Path) -> bool:
        return path.is_file() and bool(json.loads(path.read_text()).get("complete"))
    return [name for name in settings.pos_embs if complete(results_file(settings, name))]


def merge_parts(parts: Path, lengths: tuple[int, ...], iteration: int, num_tokens: int) -> dict[str, Any] | None:
    """One ``evaluate.py`` results document from the part files of one checkpoint and token budget
    (a length scored twice keeps its first result); ``complete`` when every length is in it."""
    docs = []
    for path in sorted(parts.glob("*.json"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        run, protocol = doc.get("run", {}), doc.get("protocol", {})
        if run.get("iteration") == iteration and protocol.get("num_tokens") == num_tokens:
            docs.append(doc)
    if not docs:
        return None
    merged = copy.deepcopy(docs[0])
    rows: dict[int, dict[str, Any]] = {}
    for doc in docs:
        for row in doc["results"]:
            rows.setdefault(int(row["length"]), row)
        kernels = doc["protocol"].get("attention_impl_per_length", {})
        merged["protocol"]["attention_impl_per_length"].update(kernels)
    merged["results"] = [rows[length] for length in sorted(rows)]
    merged["environment"]["seconds"] = sum(doc["environment"].get("seconds", 0.0) for doc in docs)
    merged["complete"] = set(lengths) <= set(rows)
    return merged


def _evaluate_lengths(ctx: Context, corpus: PreparedData, pos_emb: str, lengths: list[int], impl: str) -> Outcome:
    """One ``evaluate.py`` child scoring ``lengths`` into the next numbered part file."""
    settings, tokens = ctx.settings, int(ctx.state.eval_tokens or 0)
    parts = settings.work / "results" / f"{pos_emb}.parts"
    number = max((int(p.stem) for p in parts.glob("*.json") if p.stem.isdigit()), default=0) + 1
    ctx.out(f"evaluating {pos_emb} at {', '.join(map(str, lengths))} ({tokens:,} tokens each, attention_impl {impl})")
    command = [ctx.python, REPO / "evaluate.py", *config_arguments(settings, corpus, pos_emb, impl),
               "--load", run_folder(settings, pos_emb) / "checkpoints", "--eval-lengths", ",".join(map(str, lengths)),
               "--protocol", "nonoverlap", "--num-tokens", str(tokens), "--output", parts / f"{number}.json",
               "--no-progress"]
    return run_child(command, log_path=ctx.log(f"{pos_emb}-evaluate"), stop=ctx.stop, deadline=ctx.stage_deadline,
                     grace=EVAL_GRACE_S, on_line=echo_lines(ctx, pos_emb), env=ctx.env)


def evaluate(ctx: Context, corpus: PreparedData, pos_emb: str) -> bool:
    """Score ``pos_emb``'s final checkpoint at every length (True) or until this chunk ends (False)."""
    settings, record = ctx.settings, ctx.state.run(pos_emb)
    lengths, tokens = settings.scale.lengths, int(ctx.state.eval_tokens or 0)
    parts = settings.work / "results" / f"{pos_emb}.parts"
    merged = merge_parts(parts, lengths, settings.steps, tokens)
    while merged is None or not merged["complete"]:
        if ctx.stop.requested or ctx.time_left() <= 0:
            return False
        done = {row["length"] for row in merged["results"]} if merged else set()
        impl = record.impl("evaluate", settings.attention_impl)
        outcome = _evaluate_lengths(ctx, corpus, pos_emb, [n for n in lengths if n not in done], impl)
        merged = merge_parts(parts, lengths, settings.steps, tokens)
        scored = {row["length"] for row in merged["results"]} - done if merged else set()
        complete = merged is not None and merged["complete"]
        status = "finished" if complete else "stopped" if outcome.ok or outcome.stopped else "failed"
        record.chunks.append(Chunk("evaluate", outcome.seconds, settings.steps, settings.steps, impl, status))
        ctx.state.save()
        if merged is not None:
            write_json_atomic(results_file(settings, pos_emb), merged)
        if status == "stopped":
            return False
        if status == "failed":
            reason = flex_failure(outcome.tail)
            if scored or reason is None or impl == "sdpa":
                raise stage_failure(f"evaluating {pos_emb}", outcome, ctx.log(f"{pos_emb}-evaluate"))
            record.eval_fallback = reason
            ctx.state.save()
            ctx.out(f"evaluating {pos_emb}: FlexAttention failed ({reason}); continuing with attention_impl sdpa")
    write_json_atomic(results_file(settings, pos_emb), merged)
    ctx.progress.evaluated.add(pos_emb)
    ctx.progress.eval_seconds.append(record.seconds("evaluate"))
    return True
