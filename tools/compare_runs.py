"""Table 3 of the KERPLE paper from evaluate.py results: mean ± std over seeds, † marks.

    python tools/compare_runs.py results/*.json --reference kerple_log --format markdown

Runs are grouped by dataset, train length and protocol, then by embedding (a run evaluated with
--attention-window W is its own column, "<pos_emb>-windowed@W"). Each candidate is compared with the
reference by a paired two-sided t-test over seeds at every length (α = 0.05); † marks a candidate
the reference beats significantly. Runs of one table must have scored the same tokens (split, token
budget, sliding stride). Writes comparison.<md|tex|csv> and ppl_vs_length_<group>.png
next to the results (or into --output-dir) and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kerple.errors import entry_point, exit_on_interrupt
from kerple.flags import PROBABILITY, check_number
from kerple.outputs import check_output_folder


def compare(*args: object, **kwargs: object) -> tuple[str, list[Path]]:
    """:func:`kerple.evaluation.compare.compare`, imported when used (scipy and matplotlib take seconds)."""
    with exit_on_interrupt("compare_runs.py"):
        from kerple.evaluation.compare import compare as build_tables

    return build_tables(*args, **kwargs)


@entry_point("compare_runs.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results JSON files written by evaluate.py")
    parser.add_argument("--reference", default="kerple_log", help="embedding the others are tested against")
    parser.add_argument("--format", choices=("markdown", "latex", "csv"), default="markdown")
    parser.add_argument("--alpha", type=float, help="significance level of the t-test (default: 0.05)")
    parser.add_argument("--output-dir", help="where to write the table and plots (default: beside the results)")
    args = parser.parse_args(argv)
    check_number("--alpha", args.alpha, PROBABILITY, " (a significance level, e.g. 0.05)")
    check_output_folder(args.output_dir or Path(args.results[0]).parent, "--output-dir")
    options = {} if args.alpha is None else {"alpha": args.alpha}
    text, written = compare(args.results, reference=args.reference, fmt=args.format, out_dir=args.output_dir,
                            **options)
    print(text)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
