"""The lease's report, in ``--output`` only: ``report.md``, ``report.json``, the plot and ``logs.txt``.

A lease returns at most 8 files of at most 16 MiB each, no deeper than two folders, from one
folder; the report is these four files, side by side, rewritten whole after every stage (each
atomically), so the folder always holds one consistent report. ``report.json`` holds the plan and
what each run measured (tokens/s, start-up, evaluation seconds): given to the next lease as
``--throughput-report``, it sizes that lease from this one's measurements. ``logs.txt`` holds the
last lines of every child's log, which stays on the machine with the corpus and checkpoints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kerple.atomic import write_json_atomic, write_text_atomic
from kerple.data.prepared import PreparedData
from kerple.evaluation.stats import display_name
from kerple.outputs import check_output_folder
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.lease import LEASE_FORMAT, LeasePlan
from kerple.reproduce.plan import Settings
from kerple.reproduce.report import (corpus_line, evaluation_kernels, evaluation_line, format_tokens, licence_lines,
                                     load_ppl,
                                     median_tokens_per_s, paper_checks, ppl_table, recipe_line, status_line,
                                     timing_table, training_kernel, write_plot)
from kerple.reproduce.state import State
from kerple.training.monitor import format_duration

REPORT_FILES = ("report.md", "report.json", "ppl_vs_length.png", "logs.txt")
MAX_FILES, MAX_DEPTH, MAX_FILE_BYTES = 8, 2, 16 * 2**20  # what a lease returns
LOG_TAIL_LINES, LOG_LINE_CHARS = 40, 400
STOPPED_BY = {"cap": "reached the cap", "sources": "read every source file before the cap",
              "deadline": "stopped reading and tokenizing when its time was spent, below the cap"}


def check_output(output: Path, work: Path) -> None:
    """Refuse, before any work, an ``--output`` that would return more than the report: inside the
    work folder or holding it, a file, or a folder with files of its own."""
    if output == work or output.is_relative_to(work):
        raise ReproduceError(f"--output {output} is inside the work folder {work}, whose corpus and checkpoints "
                             "must not come back: give an --output outside it (or another --work)")
    if work.is_relative_to(output):
        raise ReproduceError(f"--work {work} is inside --output {output}: the corpus and checkpoints would come "
                             "back with the report; give a --work outside it (the default is under /tmp)")
    if output.is_dir():
        for leftover in output.glob(".*"):  # a temporary file of a write that was killed (kerple.atomic)
            if leftover.is_file() and any(leftover.name.startswith(f".{name}.") for name in REPORT_FILES):
                leftover.unlink()
        others = sorted(path.name for path in output.iterdir() if path.name not in REPORT_FILES)
        if others:
            raise ReproduceError(f"--output {output} holds other files ({', '.join(others[:3])}); a lease returns at "
                                 "most 8 files: name a new or empty folder")
    check_output_folder(output, "--output")


def output_problems(folder: Path) -> list[str]:
    """What in ``folder`` a lease would not return: over 8 files, over 16 MiB, deeper than 2 folders."""
    files = [path for path in folder.rglob("*") if path.is_file()]
    problems = [f"{len(files)} files (at most {MAX_FILES})"] if len(files) > MAX_FILES else []
    for path in files:
        relative = path.relative_to(folder)
        if len(relative.parts) - 1 > MAX_DEPTH:
            problems.append(f"{relative}: {len(relative.parts) - 1} folders deep (at most {MAX_DEPTH})")
        if path.stat().st_size > MAX_FILE_BYTES:
            problems.append(f"{relative}: {path.stat().st_size:,} bytes (at most {MAX_FILE_BYTES:,})")
    return problems


def write_lease_report(settings: Settings, state: State, corpus: PreparedData | None, output: Path) -> list[Path]:
    """Write the report's files into ``output`` from what is on disk; return them."""
    output.mkdir(parents=True, exist_ok=True)
    ppl = load_ppl(settings) if state.lease else {}
    plot = write_plot(settings, ppl, output / "ppl_vs_length.png")
    written = [plot] if plot is not None else []
    written.append(write_text_atomic(output / "report.md", page_text(settings, state, corpus, ppl, plot)))
    written.append(write_json_atomic(output / "report.json", report_document(settings, state, corpus, ppl)))
    written.append(write_text_atomic(output / "logs.txt", log_tails(settings.work / "logs")))
    return written


def page_text(settings: Settings, state: State, corpus: PreparedData | None, ppl: dict[str, dict[int, float]],
              plot: Path | None) -> str:
    """``report.md``."""
    plan = LeasePlan(**state.lease) if state.lease else None
    title = ("KERPLE Table 3 at 162M in one GPU lease" if settings.scale.name == "full" else
             "KERPLE Table 3 in one lease, tiny scale (a CPU check of the orchestration; the numbers mean nothing)")
    steps = f"{plan.steps:,} steps per run where the paper trains 50,000" if plan else "A few steps per run"
    return "\n\n".join([
        f"# {title}",
        "Written by `python3 tools/gpu_reproduce.py --preset lease` into its `--output` folder when it starts and "
        f"after every stage, so a command stopped from outside leaves what it finished. {steps}: the table shows "
        "where the embeddings stand after a short training, not the paper's converged perplexities.",
        status_line(settings, state, ppl),
        "## Lease plan\n\n" + "\n".join(plan_lines(settings, state, plan)),
        "## Set-up\n\n" + "\n".join(setup_lines(settings, state, corpus, plan)),
        "## Perplexity (Table 3 layout)\n\n" + ppl_table(settings, ppl),
        f"![perplexity vs length]({plot.name})" if plot is not None else "Plot: pending (no run evaluated yet).",
        "## Time per run\n\nWall time of each child process (start-up and compilation included); tokens/s is the "
        "median of the trainer's logged steps.\n\n" + timing_table(settings, state)
        + ("\n\n" + planned_table(settings, state, plan) if plan else ""),
        "## Against the paper's Table 3\n\n" + "\n".join(paper_checks(settings, ppl)),
    ]) + "\n"


def plan_lines(settings: Settings, state: State, plan: LeasePlan | None) -> list[str]:
    """The throughput assumed and where it came from, the sizing, and what did not fit."""
    if plan is None:
        return ["- **Plan**: pending: the steps per run are sized from the measured throughput once the corpus "
                "is ready."]
    rates = plan.tokens_per_s
    rate_text = (f"{next(iter(rates.values())):,.0f} tokens/s for every run" if len(set(rates.values())) == 1 else
                 ", ".join(f"{display_name(name)} {rate:,.0f}" for name, rate in rates.items()) + " tokens/s")
    overheads = {name: plan.overhead_s(name) for name in plan.kernels}
    after = " and the throughput probe" + f" ({plan.probe_s:.0f} s)" if plan.probe_s is not None else ""
    tokens_per_step = settings.scale.tokens_per_step
    return [
        f"- **Throughput assumed**: {rate_text}, from {plan.throughput_source}.",
        f"- **Sizing** (`--minutes {plan.minutes:g}`): {plan.budget_s:.0f} s were left once the corpus{after} "
        f"{'was' if not after else 'were'} done. Each run's start-up, checkpoint, evaluation and report rewrites "
        f"were taken as {', '.join(f'{name} {seconds:.0f} s' for name, seconds in overheads.items())} "
        f"({sum(overheads.values()):.0f} s); {plan.safety:.0%} of the rest went to training: steps = floor("
        f"{plan.safety:g} x ({plan.budget_s:.0f} - {sum(overheads.values()):.0f}) / "
        f"{sum(tokens_per_step / rates[name] for name in plan.kernels):.4f} s per step of all runs) = "
        f"{plan.steps:,} per run ({format_tokens(plan.steps * tokens_per_step)} tokens).",
        *[f"- **Not run**: {note}." for note in plan.notes],
    ]


def setup_lines(settings: Settings, state: State, corpus: PreparedData | None, plan: LeasePlan | None) -> list[str]:
    """Recipe, the capped corpus and its tokenizer, licences, and the evaluation with its per-length cap."""
    lines = [recipe_line(settings)] if plan else []
    if corpus is None:
        return [*lines, "- **Corpus**: the Python sources on the machine (pending)."]
    cap = corpus.source.get("cap", {})
    seconds = f" after {format_duration(state.corpus_seconds)}" if state.corpus_seconds else ""
    lines += [
        corpus_line(settings, corpus) + "." if plan else corpus_line(settings, corpus).split(". The budget")[0] + ".",
        f"- **Corpus cap** (`--corpus-tokens`): at most {cap.get('max_tokens', 0):,} tokens within "
        f"{cap.get('seconds_allowed', 0):.0f} s; the stage {STOPPED_BY.get(cap.get('stopped_by'), 'ended')}{seconds}, "
        f"with {sum(corpus.tokens(part) for part in ('train', 'valid', 'test')):,} tokens.",
        f"- **Tokenizer**: a byte-level BPE of {corpus.vocab_size:,} ids trained on the first "
        f"{cap.get('bpe_sample_chars', 0) / 2**20:,.0f} MiB of train files in reading order "
        "(`kerple/reproduce/corpus.py`).",
        *licence_lines(corpus),
    ]
    if plan:
        longest = settings.scale.lengths[-1]
        lines.append(evaluation_line(settings, state, corpus)[:-1] + f" (the lease's cap: at most "
                     f"{plan.eval_token_cap:,} per length, {plan.eval_token_cap // longest} windows of {longest:,}).")
    return lines


def planned_table(settings: Settings, state: State, plan: LeasePlan) -> str:
    """Per run: the seconds the plan assumed against those the run took."""
    lines = ["| run | kernels planned (train / eval) | training planned / taken | evaluation planned / taken |",
             "|---|---|---:|---:|"]
    for name in settings.pos_embs:
        record = state.runs.get(name)
        train_s = record.seconds("train") if record else 0.0
        eval_s = record.seconds("evaluate") if record else 0.0
        planned = plan.start_s[name] + plan.checkpoint_s + plan.steps_s(name, settings.scale.tokens_per_step)
        lines.append(f"| {display_name(name)} | {plan.kernels[name]} / {plan.eval_kernels[name]} | {planned:.0f} s / "
                     f"{f'{train_s:.0f} s' if train_s else '-'} | {plan.eval_s[name]:.0f} s / "
                     f"{f'{eval_s:.0f} s' if eval_s else '-'} |")
    return "\n".join(lines)


def measured(settings: Settings, state: State, plan: LeasePlan | None) -> dict[str, Any]:
    """What the runs measured, as the next lease's ``--throughput-report`` reads it: tokens/s per run,
    and the largest start-up (training wall time less its steps and the checkpoint estimate) per
    training kernel and evaluation time per evaluation kernel of a finished run."""
    rates: dict[str, float] = {}
    start: dict[str, float] = {}
    evaluate: dict[str, float] = {}
    for name in settings.pos_embs:
        record, rate = state.runs.get(name), median_tokens_per_s(settings, name)
        if record is None or rate is None or plan is None:
            continue
        rates[name] = round(rate, 1)
        kernel = training_kernel(settings, state, name, record.last_impl("train"))
        steps = max(chunk.end_step - chunk.start_step for chunk in record.chunks)
        overhead = record.seconds("train") - steps * settings.scale.tokens_per_step / rate - plan.checkpoint_s
        if any(c.kind == "train" and c.status == "finished" for c in record.chunks):
            start[kernel] = round(max(start.get(kernel, 0.0), overhead, 0.0), 1)
        if any(c.kind == "evaluate" and c.status == "finished" for c in record.chunks):
            recorded = evaluation_kernels(settings, name).split(", ")
            key = "flex" if "flex" in recorded else recorded[0]
            evaluate[key] = round(max(evaluate.get(key, 0.0), record.seconds("evaluate")), 1)
    return {"tokens_per_s": rates, "train_start_s": start, "eval_s": evaluate}


def report_document(settings: Settings, state: State, corpus: PreparedData | None,
                    ppl: dict[str, dict[int, float]]) -> dict[str, Any]:
    """``report.json``: the plan, the corpus, each run's times and perplexities, the findings, and
    what was measured."""
    plan = LeasePlan(**state.lease) if state.lease else None
    runs = {}
    for name in settings.pos_embs:
        record = state.runs.get(name)
        runs[name] = {"chunks": [vars(chunk) for chunk in record.chunks] if record else [],
                      "tokens_per_s": median_tokens_per_s(settings, name),
                      "ppl": {str(length): value for length, value in sorted(ppl.get(name, {}).items())}}
    return {
        "format": LEASE_FORMAT, "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "device": state.device,
        "status": status_line(settings, state, ppl).removeprefix("**Status:** "),
        "scale": settings.scale.name, "pos_embs": list(settings.pos_embs), "steps": plan.steps if plan else None,
        "tokens_per_step": settings.scale.tokens_per_step, "lengths": list(settings.scale.lengths),
        "eval_tokens": state.eval_tokens, "plan": state.lease,
        "corpus": None if corpus is None else {"parts": corpus.parts, "split": corpus.split, "seconds":
                                                state.corpus_seconds, "cap": corpus.source.get("cap")},
        "runs": runs, "findings": paper_checks(settings, ppl), "measured": measured(settings, state, plan),
    }


def log_tails(folder: Path) -> str:
    """The last lines of every child's log, oldest log first."""
    logs = sorted(folder.glob("*.log"), key=lambda path: path.stat().st_mtime) if folder.is_dir() else []
    parts = []
    for path in logs:
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        parts.append(f"== {path.name} (last {len(lines)} lines; the whole log stays in {path.parent})\n"
                     + "\n".join(line[:LOG_LINE_CHARS] for line in lines))
    return "\n\n".join(parts) + "\n" if parts else "no child has run yet\n"
