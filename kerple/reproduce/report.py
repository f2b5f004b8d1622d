"""The report of a reproduction: Table 3's layout, the perplexity plot, timings, and the paper's claims.

Written after every chunk from what is on disk, so a partial reproduction shows what it has and
marks the rest ``pending``. Cells hold the perplexity of one seed with Table 3's rounding
(:func:`kerple.evaluation.stats.format_mean_std`); the plot is
:func:`kerple.evaluation.compare.plot_table`. The README gets the tables between two marker lines;
the docs page is the whole report.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from kerple.atomic import write_text_atomic
from kerple.data.prepared import PreparedData
from kerple.evaluation.stats import build_tables, display_name, format_mean_std, load_run
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.plan import PAPER_STEPS, REPO, Settings, run_folder
from kerple.reproduce.stages import choose_eval_tokens, results_file
from kerple.reproduce.state import State
from kerple.training.monitor import format_duration

PENDING = "pending: no GPU has run this"
BEGIN = "<!-- gpu-reproduce:begin -->"
END = "<!-- gpu-reproduce:end -->"


@dataclass(frozen=True)
class Outputs:
    """Where the report goes: the docs page, its plot, and the README whose marked section it fills."""

    page: Path
    plot: Path
    readme: Path | None


def format_tokens(count: int) -> str:
    """``819.2M`` for millions and more, ``7,680`` below."""
    return f"{count / 1e6:,.1f}M" if count >= 1e6 else f"{count:,}"


def check_readme(readme: Path | None) -> None:
    """Refuse, before any work, a README without exactly one marked section."""
    if readme is None:
        return
    text = readme.read_text() if readme.is_file() else ""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ReproduceError(f"--readme {readme}: needs one line {BEGIN} followed by one line {END} "
                             "around the section to fill")


def load_ppl(settings: Settings) -> dict[str, dict[int, float]]:
    """Perplexity per length of every run with results (complete or not)."""
    found = {}
    for pos_emb in settings.pos_embs:
        path = results_file(settings, pos_emb)
        if path.is_file():
            found[pos_emb] = load_run(path).ppl
    return found


def ppl_table(settings: Settings, ppl: dict[str, dict[int, float]]) -> str:
    """Table 3's layout: a row per evaluation length, a column per embedding, one seed per cell."""
    header = ["Extrp.", *(display_name(name) for name in settings.pos_embs)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    for length in settings.scale.lengths:
        cells = [format_mean_std(ppl[name][length], 0.0).split(" ±")[0] if length in ppl.get(name, {}) else "pending"
                 for name in settings.pos_embs]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def median_tokens_per_s(settings: Settings, pos_emb: str) -> float | None:
    """Median of the trainer's logged tokens/s (``metrics.jsonl``, every ``log_interval`` steps)."""
    path = run_folder(settings, pos_emb) / "logs" / "metrics.jsonl"
    if not path.is_file():
        return None
    values = []
    for line in path.read_text().splitlines():
        try:
            value = json.loads(line).get("train/tokens_per_s")
        except ValueError:
            continue
        if isinstance(value, (int, float)):
            values.append(float(value))
    return statistics.median(values) if values else None


def training_kernel(settings: Settings, state: State, pos_emb: str, requested: str) -> str:
    """The attention kernel a training chunk ran: ``requested``, or what ``auto`` picks for this
    embedding at the train length on the recorded device (``kerple.model.attention.choose_implementation``)."""
    if requested != "auto":
        return requested
    from kerple.model.attention import choose_implementation
    from kerple.positional import family

    device = "cpu" if (state.device or "CPU") == "CPU" else "cuda"
    return choose_implementation(family(pos_emb).kind, device, True, settings.scale.seq_length)


def evaluation_kernels(settings: Settings, pos_emb: str) -> str:
    """The kernels ``evaluate.py`` recorded per length, in length order (``sdpa``, ``flex``, ...)."""
    path = results_file(settings, pos_emb)
    if not path.is_file():
        return "-"
    per_length = json.loads(path.read_text())["protocol"].get("attention_impl_per_length", {})
    kernels = [per_length[key] for key in sorted(per_length, key=int)]
    return ", ".join(dict.fromkeys(kernels)) or "-"


def timing_table(settings: Settings, state: State) -> str:
    """Per run: attention kernels, steps, training wall time over its chunks, tokens/s, evaluation time."""
    header = ["run", "attention (train / eval)", "steps", "training wall time (chunks)", "tokens/s",
              "evaluation wall time"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|---:|"]
    for pos_emb in settings.pos_embs:
        record = state.runs.get(pos_emb)
        if record is None or not record.chunks:
            lines.append(f"| {display_name(pos_emb)} | pending | | | | |")
            continue
        steps = max(chunk.end_step for chunk in record.chunks)
        speed = median_tokens_per_s(settings, pos_emb)
        train_s, evaluate_s = record.seconds("train"), record.seconds("evaluate")
        kernel = training_kernel(settings, state, pos_emb, record.last_impl("train"))
        cells = [display_name(pos_emb), f"{kernel} / {evaluation_kernels(settings, pos_emb)}",
                 f"{steps:,} of {settings.steps:,}", f"{format_duration(train_s)} ({record.count('train')})",
                 "" if speed is None else f"{speed:,.0f}", format_duration(evaluate_s) if evaluate_s else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paper_checks(settings: Settings, ppl: dict[str, dict[int, float]]) -> list[str]:
    """Table 3's findings, each as measured here: holds, does not hold, or pending."""
    base, lengths = settings.scale.seq_length, settings.scale.lengths
    longest, far = lengths[-1], base * 8  # Table 3: rotary at 4096 is 3.2-5.0x its value at 512 on all three data sets

    def verdict(ok: bool | None, text: str) -> str:
        return f"- **{'pending' if ok is None else 'holds' if ok else 'does not hold'}**: {text}"

    log, alibi, rotary = ppl.get("kerple_log", {}), ppl.get("alibi", {}), ppl.get("rotary", {})
    checks = []
    if "kerple_log" in settings.pos_embs:
        ok = None if {base, longest} - set(log) else log[longest] <= 1.05 * log[base]
        detail = "" if ok is None else f" ({log[base]:.3g} at {base}, {log[longest]:.3g} at {longest})"
        checks.append(verdict(ok, f"KERPLE (log) stays flat or falls to {longest}: perplexity at {longest} at most "
                                  f"1.05 x that at {base}{detail}"))
    if {"kerple_log", "alibi"} <= set(settings.pos_embs):
        longer = [length for length in lengths if length > base]
        ok = None if set(longer) - set(log) or set(longer) - set(alibi) else all(
            log[length] < alibi[length] for length in longer)
        checks.append(verdict(ok, f"KERPLE (log) is below ALiBi at every length from {2 * base} to {longest}"))
    if "rotary" in settings.pos_embs:
        ok = None if {base, far} - set(rotary) else rotary[far] >= 2 * rotary[base]
        detail = "" if ok is None else f" ({rotary[base]:.3g} at {base}, {rotary[far]:.3g} at {far})"
        checks.append(verdict(ok, f"Rotary explodes past {2 * base}: perplexity at {far} at least twice that at "
                                  f"{base}{detail}"))
    return checks


def status_line(settings: Settings, state: State, ppl: dict[str, dict[int, float]]) -> str:
    complete = [name for name in settings.pos_embs if len(ppl.get(name, {})) == len(settings.scale.lengths)]
    if not ppl and not any(record.chunks for record in state.runs.values()):
        return f"**Status:** {PENDING}."
    word = "complete" if len(complete) == len(settings.pos_embs) else "in progress"
    return (f"**Status:** {word}: {len(complete)} of {len(settings.pos_embs)} runs evaluated on "
            f"{state.device or 'an unrecorded device'} (written {time.strftime('%Y-%m-%d')}).")


def setup_lines(settings: Settings, state: State, corpus: PreparedData | None) -> list[str]:
    """The corpus, the recipe and the budget, as this reproduction ran them."""
    lines = [recipe_line(settings)]
    if corpus is None:
        return [*lines, f"- **Corpus**: the Python sources on the machine ({PENDING})."]
    lines.append(corpus_line(settings, corpus) + (f"; prepared in {format_duration(state.corpus_seconds)}."
                                                  if state.corpus_seconds else "."))
    lines.append(f"- **Tokenizer**: a byte-level BPE of {corpus.vocab_size:,} ids trained on the train split "
                 "(`prepare_data.py python --train-tokenizer`).")
    return [*lines, *licence_lines(corpus), evaluation_line(settings, state, corpus)]


def recipe_line(settings: Settings) -> str:
    """The model files, steps, batch and tokens per run, against the paper's."""
    scale, steps = settings.scale, settings.steps
    return (f"- **Recipe**: {', '.join(f'`{name}`' for name in scale.model_files)} with `configs/pe/<run>.yml` "
            f"(KERPLE §5.1 Table 2): {steps:,} steps of {scale.micro_batch} x {scale.seq_length} tokens = "
            f"{format_tokens(steps * scale.tokens_per_step)} tokens per run (the paper: {PAPER_STEPS:,} steps = "
            f"{format_tokens(PAPER_STEPS * 32 * 512)}), the cosine schedule and 1% warm-up spanning them; seed "
            f"{settings.seed}, one seed (so no † marks).")


def corpus_line(settings: Settings, corpus: PreparedData) -> str:
    """Files, roots, the held-out splits and the budget in epochs (no final full stop)."""
    source, tokens = corpus.source, settings.steps * settings.scale.tokens_per_step
    return (f"- **Corpus**: {source.get('files_kept', 0):,} Python files ({source.get('bytes_kept', 0) / 2**20:,.1f} "
            f"MiB; {source.get('duplicates_removed', 0):,} duplicates of other files removed) from "
            f"{', '.join(f'`{root}`' for root in source.get('roots', []))}, held out by file: train "
            f"{corpus.documents('train'):,} files / {corpus.tokens('train'):,} tokens, validation "
            f"{corpus.documents('valid'):,} / {corpus.tokens('valid'):,}, test {corpus.documents('test'):,} / "
            f"{corpus.tokens('test'):,}. The budget is {tokens / max(corpus.tokens('train'), 1):.1f} epochs of the "
            "train split")


def licence_lines(corpus: PreparedData) -> list[str]:
    """Files per licence, from the installed packages' metadata (none when it names none)."""
    licenses = corpus.source.get("licenses", {})
    if not licenses:
        return []
    return ["- **Licences** (files per licence, from the installed packages' metadata; the files stay on the "
            "machine): " + ", ".join(f"{name} {count:,}" for name, count in list(licenses.items())[:8])
            + (f", {len(licenses) - 8} more" if len(licenses) > 8 else "") + "."]


def evaluation_line(settings: Settings, state: State, corpus: PreparedData) -> str:
    """The protocol and the tokens scored at every length."""
    return (f"- **Evaluation**: `evaluate.py --protocol nonoverlap` (KERPLE §5.2) on the validation split, "
            f"the same {state.eval_tokens or choose_eval_tokens(settings, corpus):,} tokens at every length.")


def readme_section(settings: Settings, state: State, ppl: dict[str, dict[int, float]], outputs: Outputs) -> str:
    """The text between the README's markers: status, perplexity table, timings, link to the page."""
    base = outputs.readme.parent if outputs.readme is not None else REPO
    page = Path(os.path.relpath(outputs.page, base)).as_posix()  # a link that works from the marked page
    return "\n\n".join([
        status_line(settings, state, ppl),
        f"Perplexity on the held-out Python files (train length {settings.scale.seq_length}, "
        f"{format_tokens(settings.steps * settings.scale.tokens_per_step)} training tokens per run):",
        ppl_table(settings, ppl),
        timing_table(settings, state),
        f"Corpus, recipe, plot and the comparison with the paper's Table 3: [{page}]({page}).",
    ])


def page_text(settings: Settings, state: State, corpus: PreparedData | None, ppl: dict[str, dict[int, float]],
              plot: Path | None, outputs: Outputs) -> str:
    """The whole docs page."""
    title = ("KERPLE Table 3 at 162M on one GPU" if settings.scale.name == "full" else
             "KERPLE Table 3, tiny scale (a CPU check of the orchestration; the numbers mean nothing)")
    image = (f"![perplexity vs length]({plot.relative_to(outputs.page.parent).as_posix()})"
             if plot is not None else f"Plot: {PENDING}.")
    return "\n\n".join([
        f"# {title}",
        "Written by `make gpu-reproduce` (`tools/gpu_reproduce.py`) after every chunk; re-running the command "
        "continues the reproduction and rewrites this page.",
        status_line(settings, state, ppl),
        "## Set-up\n\n" + "\n".join(setup_lines(settings, state, corpus)),
        "## Perplexity (Table 3 layout)\n\n" + ppl_table(settings, ppl),
        image,
        "## Time per run\n\nWall time sums the run's chunks (start-up, compilation and checkpoints included); "
        "tokens/s is the median of the trainer's logged steps.\n\n" + timing_table(settings, state),
        *(["Attention: " + "; ".join(fallbacks)] if (fallbacks := _fallbacks(settings, state)) else []),
        "## Against the paper's Table 3\n\n" + "\n".join(paper_checks(settings, ppl)),
    ]) + "\n"


def _fallbacks(settings: Settings, state: State) -> list[str]:
    notes = []
    for pos_emb in settings.pos_embs:
        record = state.runs.get(pos_emb)
        for kind, reason in (("training", record and record.fallback), ("evaluation", record and record.eval_fallback)):
            if reason:
                notes.append(f"{pos_emb} {kind} used sdpa because FlexAttention failed: `{reason}`")
    return notes


def write_plot(settings: Settings, ppl: dict[str, dict[int, float]], path: Path) -> Path | None:
    """Perplexity against length of every run with results, into ``path``; None before any result."""
    if not ppl:
        return None
    from kerple.evaluation.compare import plot_table  # matplotlib: only when there is something to plot

    runs = [load_run(results_file(settings, name)) for name in settings.pos_embs if name in ppl]
    return plot_table(build_tables(runs, reference=runs[0].variant)[0], path)


def write_report(settings: Settings, state: State, corpus: PreparedData | None, outputs: Outputs) -> list[Path]:
    """Write the plot (when any run has results), the docs page and the README section; return them."""
    ppl = load_ppl(settings)
    plot = write_plot(settings, ppl, outputs.plot)
    written = [plot] if plot is not None else []
    written.append(write_text_atomic(outputs.page, page_text(settings, state, corpus, ppl, plot, outputs)))
    if outputs.readme is not None:
        text = outputs.readme.read_text()
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        section = readme_section(settings, state, ppl, outputs)
        written.append(write_text_atomic(outputs.readme, f"{head}{BEGIN}\n{section}\n{END}{tail}"))
    return written
