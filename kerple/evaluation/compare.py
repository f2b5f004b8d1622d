"""Compare evaluated runs: the Table-3 layout (KERPLE §5.2) and a perplexity-vs-length plot.

Used by ``tools/compare_runs.py`` and ``make demo`` (:mod:`kerple.jobs.demo`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from kerple.atomic import write_text_atomic
from kerple.evaluation.errors import EvaluationError
from kerple.evaluation.plots import plot_ppl_vs_length
from kerple.evaluation.stats import ALPHA, RunResult, Table, build_tables, display_name, load_run, render

EXTENSIONS = {"markdown": "md", "latex": "tex", "csv": "csv"}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()


def plot_table(table: Table, path: str | Path) -> Path:
    """Mean perplexity (± std band over seeds) against length, one line per variant."""
    series = {}
    for variant in table.variants:
        rows = [(length, table.cells[(length, variant)]) for length in table.lengths if (length, variant) in table.cells]
        series[display_name(variant)] = (
            [length for length, _ in rows],
            [cell.mean for _, cell in rows],
            [cell.std for _, cell in rows],
        )
    train_length = None
    match = re.search(r"train length (\d+)", table.title)
    if match:
        train_length = int(match.group(1))
    return plot_ppl_vs_length(series, path, title=table.title, train_length=train_length)


def _incomplete_note(runs: Sequence[RunResult], fmt: str) -> str:
    """A line naming the results files of an ``evaluate.py`` that stopped before its last length (their
    missing lengths are blank cells, and a column's mean may then rest on fewer seeds); '' when none."""
    stopped = [run.path for run in runs if not run.complete]
    if not stopped or fmt == "csv":
        return ""
    line = (f"Incomplete: evaluate.py stopped before scoring every length it was asked for in {', '.join(stopped)}; "
            "run it again with the same --output for a complete file.")
    return ("% " + line if fmt == "latex" else line) + "\n"


def compare(
    paths: Sequence[str | Path],
    *,
    reference: str = "kerple_log",
    fmt: str = "markdown",
    out_dir: str | Path | None = None,
    alpha: float = ALPHA,
) -> tuple[str, list[Path]]:
    """Build the tables of the runs in ``paths``; write the table file and one plot per table.

    Outputs go to ``out_dir`` (default: the folder of the first results file):
    ``comparison.<md|tex|csv>`` and ``ppl_vs_length_<group>.png``. Returns (table text, written files).
    """
    if not paths:
        raise ValueError("no results files given")
    if fmt not in EXTENSIONS:
        raise ValueError(f"unknown format {fmt!r}; choose {', '.join(EXTENSIONS)}")
    files: dict[Path, str | Path] = {}
    for path in paths:  # a file named twice (overlapping globs) is read once
        files.setdefault(Path(path).resolve(), path)
    runs = [load_run(path) for path in files.values()]
    tables = build_tables(runs, reference=reference, alpha=alpha)
    if not any(reference in table.variants for table in tables):
        found = sorted({run.variant for run in runs})
        raise EvaluationError(f"reference {reference!r} is not among the runs ({', '.join(found)})")
    text = render(tables, fmt, alpha) + _incomplete_note(runs, fmt)
    folder = Path(out_dir) if out_dir is not None else Path(paths[0]).parent
    written = [write_text_atomic(folder / f"comparison.{EXTENSIONS[fmt]}", text)]
    for table in tables:
        written.append(plot_table(table, folder / f"ppl_vs_length_{_slug(table.title)}.png"))
    return text, written

