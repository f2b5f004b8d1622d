"""Seed statistics and the layout of the paper's Table 3 (KERPLE §5.2).

Each cell is the mean ± sample standard deviation (``ddof = 1``) of the perplexity over seeds (the
value alone for a single seed).
Each candidate embedding is compared with the reference (``kerple_log`` in the paper) by a paired
two-sided t-test per length (``scipy.stats.ttest_rel``, runs paired by seed, α = 0.05) on the
perplexities, and marked † when the reference is significantly *better* (lower perplexity).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from kerple.evaluation.errors import EvaluationError

ALPHA = 0.05
DAGGER = "†"
UNTESTED = "no t-test (fewer than two seeds shared with the reference at some length)"
# The results' protocol settings that choose which tokens a length scores (and their value in a
# results file written before the key existed): runs of one table must agree on them, or a paired
# test would compare perplexities of different text.
SCORING_KEYS = {"split": "valid", "stride": None, "num_tokens": None, "num_windows": None, "eod_mask_loss": False}

# The paper's column order and names (Table 3); other embeddings follow alphabetically.
DISPLAY_NAMES = {
    "kerple_log": "KERPLE (log)",
    "kerple_power": "KERPLE (power)",
    "alibi": "ALiBi",
    "rpe": "T5",
    "rotary": "Rotary",
    "sinusoidal": "Sinusoidal",
    "sandwich": "Sandwich",
    "fire": "FIRE",
    "cable": "CABLE",
    "xpos": "xPos",
    "learned": "Learned",
    "none": "NoPE",
}


@dataclass(frozen=True)
class RunResult:
    """One ``results.json`` written by ``evaluate.py``: one model (embedding, dataset, seed)."""

    path: str
    variant: str  # pos_emb, then "+<tag>" per run-time positional option set, "-windowed@W" with an attention window
    dataset: str
    seed: int | None
    train_length: int | None
    protocol: str
    ppl: dict[int, float] = field(default_factory=dict)
    scoring: tuple[tuple[str, object], ...] = ()  # the settings that choose the scored tokens (SCORING_KEYS)
    complete: bool = True  # False: evaluate.py stopped before it scored every length it was asked for


def load_run(path: str | Path) -> RunResult:
    """Read one ``results.json``; raises :class:`EvaluationError` naming the file when it is not one."""
    if Path(path).is_dir():
        raise EvaluationError(f"{path} is a folder; name the results JSON files in it, e.g. {Path(path) / '*.json'}")
    if not Path(path).is_file():
        raise EvaluationError(f"{path}: no such file; name results JSON files written by evaluate.py --output")
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        run, protocol = doc["run"], doc["protocol"]
        ppl = {int(row["length"]): float(row["ppl"]) for row in doc["results"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:  # ValueError: not JSON, not UTF-8
        reason = f"no key {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0][:120]
        raise EvaluationError(f"{path}: not an evaluate.py results file ({reason})") from exc
    from kerple.positional import variant_tags

    variant = "+".join((str(run["pos_emb"]), *variant_tags(run)))
    if protocol.get("attention_window"):
        variant += f"-windowed@{protocol['attention_window']}"
    return RunResult(
        path=str(path),
        variant=variant,
        dataset=str(run.get("dataset") or "unknown"),
        seed=run.get("seed"),
        train_length=run.get("train_seq_length"),
        protocol=str(protocol["name"]),
        ppl=ppl,
        scoring=tuple((key, protocol.get(key, default)) for key, default in SCORING_KEYS.items()
                      if key != "stride" or protocol["name"] == "sliding"),  # only sliding reads its stride
        complete=doc.get("complete", True) is not False,
    )


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof = 1``; 0 for a single value)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("mean_std of no values")
    std = float(array.std(ddof=1)) if array.size > 1 else 0.0
    return float(array.mean()), std


def reference_significantly_better(
    reference: Sequence[float], candidate: Sequence[float], alpha: float = ALPHA
) -> tuple[bool, float]:
    """Paired two-sided t-test (pairs in the given order); returns (†-mark, p-value).

    The mark is set when ``p < alpha`` and the reference's mean perplexity is the lower one.
    Fewer than two pairs, or identical pairs, give no mark and ``p = nan``.
    """
    if len(reference) != len(candidate):
        raise ValueError(f"paired test needs equal counts, got {len(reference)} and {len(candidate)}")
    if len(reference) < 2:
        return False, math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        result = scipy_stats.ttest_rel(reference, candidate)
    p_value = float(result.pvalue)
    if math.isnan(p_value):
        return False, p_value
    return bool(p_value < alpha and np.mean(reference) < np.mean(candidate)), p_value


@dataclass(frozen=True)
class Cell:
    mean: float
    std: float
    seeds: int
    dagger: bool
    p_value: float
    pairs: int = 0  # seeds shared with the reference: the t-test needs two


@dataclass(frozen=True)
class Table:
    """One Table-3 block: rows are lengths, columns are variants (reference first)."""

    title: str
    reference: str
    variants: list[str]
    lengths: list[int]
    cells: dict[tuple[int, str], Cell]


def _variant_order(variant: str) -> tuple[int, tuple[int, ...], str]:
    """Table 3's order; an embedding's run-time variants right after it, in the order of
    :func:`kerple.positional.variant_names`."""
    from kerple.positional import variant_names

    base, *tags = variant.split("-windowed@")[0].split("+")
    order, tag_order = list(DISPLAY_NAMES), ["", *variant_names()]
    tag_rank = tuple(tag_order.index(tag) if tag in tag_order else len(tag_order) for tag in tags or [""])
    return (order.index(base) if base in order else len(order), tag_rank, variant)


def _seed_values(runs: Sequence[RunResult], length: int) -> dict[int | None, float]:
    """Each seed's perplexity at ``length``. Two files giving one seed different perplexities are
    refused: a seed counts once in the mean and pairs once in the t-test. Files of one run at other
    lengths merge, and an equal value (a merged copy of the same evaluation) counts once."""
    values: dict[int | None, float] = {}
    sources: dict[int | None, str] = {}
    for run in runs:
        if length not in run.ppl:
            continue
        if run.seed in sources and values[run.seed] != run.ppl[length]:
            seed = "no seed" if run.seed is None else f"seed {run.seed}"
            raise EvaluationError(
                f"{sources[run.seed]} and {run.path} give {run.variant} ({seed}, {run.dataset}, {run.protocol}) "
                f"two perplexities at length {length} ({values[run.seed]:g} and {run.ppl[length]:g}): a seed "
                "counts once in the mean and the t-test; leave one of them out")
        values[run.seed], sources[run.seed] = run.ppl[length], run.path
    return values


def _check_same_tokens(runs: Sequence[RunResult]) -> None:
    """Refuse runs of one table that scored different tokens (another split, budget or stride)."""
    first = runs[0]
    for run in runs[1:]:
        if run.scoring != first.scoring:
            differ = ", ".join(f"{key} {dict(first.scoring)[key]} vs {value}"
                               for key, value in run.scoring if dict(first.scoring)[key] != value)
            raise EvaluationError(
                f"{first.path} and {run.path} scored different tokens ({differ}): their perplexities are not "
                f"paired; evaluate every run with the same --split, --num-tokens or --num-windows and --stride, "
                "or compare them in separate calls")


def build_tables(runs: Sequence[RunResult], reference: str, alpha: float = ALPHA) -> list[Table]:
    """Group runs by (dataset, train length, protocol), then by variant, and fill Table-3 cells.

    Pairs for the t-test are the seeds present in both the reference and the candidate at a length;
    every run of a table must have scored the same tokens (:data:`SCORING_KEYS`).
    """
    groups: dict[tuple[str, int | None, str], dict[str, list[RunResult]]] = {}
    for run in runs:
        groups.setdefault((run.dataset, run.train_length, run.protocol), {}).setdefault(run.variant, []).append(run)
    for by_variant in groups.values():
        _check_same_tokens([run for variant_runs in by_variant.values() for run in variant_runs])
    tables = []
    for (dataset, train_length, protocol), by_variant in sorted(groups.items(), key=lambda kv: str(kv[0])):
        variants = sorted(by_variant, key=lambda v: (v != reference, _variant_order(v)))
        lengths = sorted({length for rs in by_variant.values() for r in rs for length in r.ppl})
        cells: dict[tuple[int, str], Cell] = {}
        for length in lengths:
            ref_by_seed = _seed_values(by_variant.get(reference, []), length)
            for variant in variants:
                values = _seed_values(by_variant[variant], length)
                if not values:
                    continue
                mean, std = mean_std(list(values.values()))
                dagger, p_value, seeds = False, math.nan, []
                if variant != reference:
                    seeds = sorted((s for s in values if s in ref_by_seed), key=str)
                    dagger, p_value = reference_significantly_better(
                        [ref_by_seed[s] for s in seeds], [values[s] for s in seeds], alpha
                    )
                cells[(length, variant)] = Cell(mean, std, len(values), dagger, p_value, len(seeds))
        title = f"{dataset} (train length {train_length}, {protocol})"
        tables.append(Table(title, reference, variants, lengths, cells))
    return tables


def format_mean_std(mean: float, std: float) -> str:
    """Three significant figures on the mean, the std to the same decimal place (as Table 3)."""
    if not math.isfinite(mean):
        return f"{mean}"
    decimals = max(0, 2 - int(math.floor(math.log10(abs(mean))))) if mean else 2
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def display_name(variant: str) -> str:
    from kerple.positional import variant_names

    base, _, window = variant.partition("-windowed@")
    base, *tags = base.split("+")
    shown = variant_names()
    name = " + ".join((DISPLAY_NAMES.get(base, base), *(shown.get(tag, tag) for tag in tags)))
    return f"{name} windowed@{window}" if window else name


def _rows(table: Table, dagger: str) -> list[list[str]]:
    rows = []
    for length in table.lengths:
        row = [str(length)]
        for variant in table.variants:
            cell = table.cells.get((length, variant))
            if cell is None:
                row.append("")
                continue
            text = format_mean_std(cell.mean, cell.std) if cell.seeds > 1 else format_mean_std(cell.mean, 0.0).split(" ±")[0]
            row.append(text + (dagger if cell.dagger else ""))
        rows.append(row)
    return rows


def _untested(table: Table) -> list[str]:
    """The candidates with a cell the t-test could not judge: fewer than two seeds shared with the
    reference at that length, so no † can appear there whatever the perplexities (one seed: all of them)."""
    candidates = [variant for variant in table.variants if variant != table.reference]
    untested = [variant for variant in candidates
                if any(cell.pairs < 2 for (_, v), cell in table.cells.items() if v == variant)]
    if len(untested) == len(candidates) > 2:
        return ["every candidate"]
    return [display_name(variant) for variant in untested]


def _render_csv(tables: Sequence[Table]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["table", "length", "variant", "mean_ppl", "std_ppl", "seeds", "p_value", "dagger"])
    for table in tables:
        for length in table.lengths:
            for variant in table.variants:
                cell = table.cells.get((length, variant))
                if cell is not None:
                    writer.writerow(
                        [table.title, length, variant, cell.mean, cell.std, cell.seeds, cell.p_value, int(cell.dagger)]
                    )
    return buffer.getvalue()


def render(tables: Sequence[Table], fmt: str, alpha: float = ALPHA) -> str:
    """Render tables as ``markdown``, ``latex`` or ``csv``."""
    note = (
        f"{DAGGER}: the reference is significantly better (paired two-sided t-test over seeds, α = {alpha}); "
        "cells are mean ± std of perplexity over seeds."
    )
    if fmt == "csv":
        return _render_csv(tables)
    out = []
    for table in tables:
        header = ["Extrp."] + [display_name(v) for v in table.variants]
        if fmt == "markdown":
            out.append(f"**{table.title}**, reference {display_name(table.reference)}\n")
            out.append("| " + " | ".join(header) + " |")
            out.append("|" + "|".join("---:" for _ in header) + "|")
            out.extend("| " + " | ".join(row) + " |" for row in _rows(table, DAGGER))
            out.append("")
            if _untested(table):
                out.append(f"{UNTESTED}: {', '.join(_untested(table))}\n")
        elif fmt == "latex":
            out.append(f"% {table.title}, reference {display_name(table.reference)}")
            out.append("\\begin{tabular}{r" + "c" * len(table.variants) + "}")
            out.append(" & ".join(name.replace("_", "\\_") for name in header) + " \\\\ \\hline")
            for row in _rows(table, "$^\\dagger$"):
                out.append(" & ".join(cell.replace("±", "$\\pm$") for cell in row) + " \\\\")
            out.append("\\end{tabular}")
            if _untested(table):
                out.append(f"% {UNTESTED}: {', '.join(_untested(table))}")
            out.append("")
        else:
            raise ValueError(f"unknown format {fmt!r}; choose markdown, latex or csv")
    if fmt == "latex":
        out.append("% " + note.replace(DAGGER, "$^\\dagger$"))
    elif fmt == "markdown":
        out.append(note)
    return "\n".join(out).rstrip() + "\n"
