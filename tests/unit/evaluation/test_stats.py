"""Seed statistics and Table-3 marks against hand-computed t statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kerple.evaluation.errors import EvaluationError
from kerple.evaluation.stats import (
    build_tables,
    format_mean_std,
    load_run,
    mean_std,
    reference_significantly_better,
    render,
)

T_CRITICAL_DF4 = 2.776445  # two-sided 5% critical value of Student's t with 4 degrees of freedom

REFERENCE = [10.0, 11.0, 12.0, 10.5, 11.5]


def hand_paired_t(reference: list[float], candidate: list[float]) -> float:
    diffs = [c - r for r, c in zip(reference, candidate)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    return mean / math.sqrt(var / n)


def test_hand_computed_significant_case() -> None:
    candidate = [10.6, 11.9, 12.5, 11.2, 12.1]
    t = hand_paired_t(REFERENCE, candidate)
    assert t == pytest.approx(9.7312, abs=1e-3)  # diffs mean 0.66, sd 0.15166, se 0.067823
    assert abs(t) > T_CRITICAL_DF4
    dagger, p_value = reference_significantly_better(REFERENCE, candidate)
    assert dagger
    assert p_value < 0.05


def test_hand_computed_insignificant_case() -> None:
    candidate = [r + d for r, d in zip(REFERENCE, [0.5, -0.4, 0.3, -0.2, 0.1])]
    t = hand_paired_t(REFERENCE, candidate)
    assert t == pytest.approx(0.3679, abs=1e-3)  # diffs mean 0.06, sd 0.3647, se 0.1631
    assert abs(t) < T_CRITICAL_DF4
    dagger, p_value = reference_significantly_better(REFERENCE, candidate)
    assert not dagger
    assert p_value > 0.05


def test_no_mark_when_the_candidate_is_significantly_better() -> None:
    candidate = [r - d for r, d in zip(REFERENCE, [0.6, 0.9, 0.5, 0.7, 0.6])]
    dagger, p_value = reference_significantly_better(REFERENCE, candidate)
    assert p_value < 0.05 and not dagger


def test_too_few_pairs_give_no_mark() -> None:
    assert reference_significantly_better([1.0], [5.0])[0] is False
    with pytest.raises(ValueError, match="equal counts"):
        reference_significantly_better([1.0, 2.0], [1.0])


def test_mean_std_and_formatting() -> None:
    mean, std = mean_std([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert std == pytest.approx(math.sqrt(5 / 3))  # sum of squares 5, ddof 1
    assert mean_std([7.0]) == (7.0, 0.0)
    assert format_mean_std(23.94, 0.61) == "23.9 ± 0.6"
    assert format_mean_std(3.404, 0.2) == "3.40 ± 0.20"
    assert format_mean_std(14039.2, 2325.4) == "14039 ± 2325"


def _write(tmp: Path, pos_emb: str, seed: int, ppl: dict[int, float], window: int | None = None) -> Path:
    path = tmp / f"{pos_emb}-{seed}-{window}.json"
    doc = {
        "run": {"pos_emb": pos_emb, "dataset": "stdlib", "seed": seed, "train_seq_length": 64},
        "protocol": {"name": "nonoverlap", "attention_window": window},
        "results": [{"length": length, "loss": math.log(v), "ppl": v} for length, v in ppl.items()],
    }
    path.write_text(json.dumps(doc))
    return path


def test_table_layout_pairs_by_seed(tmp_path: Path) -> None:
    candidate = [10.6, 11.9, 12.5, 11.2, 12.1]
    paths = []
    for seed, (ref, cand) in enumerate(zip(REFERENCE, candidate)):
        paths.append(_write(tmp_path, "kerple_log", seed, {64: ref, 128: ref}))
        # at 128 the sinusoidal runs are listed in reverse seed order: pairing must use seeds
        paths.append(_write(tmp_path, "sinusoidal", seed, {64: ref + 0.01 * (seed % 2), 128: cand}))
    paths.append(_write(tmp_path, "kerple_log", 0, {64: 9.0}, window=32))
    runs = [load_run(p) for p in reversed(paths)]
    (table,) = build_tables(runs, reference="kerple_log")
    assert table.variants == ["kerple_log", "kerple_log-windowed@32", "sinusoidal"]
    assert table.lengths == [64, 128]
    assert table.cells[(128, "sinusoidal")].dagger
    assert not table.cells[(64, "sinusoidal")].dagger
    assert table.cells[(64, "kerple_log")].seeds == 5
    markdown = render([table], "markdown")
    assert "| Extrp. | KERPLE (log) | KERPLE (log) windowed@32 | Sinusoidal |" in markdown
    assert "| 128 | 11.0 ± 0.8 |  | 11.7 ± 0.8† |" in markdown
    assert "11.7 $\\pm$ 0.8$^\\dagger$" in render([table], "latex")
    csv_lines = render([table], "csv").splitlines()
    assert csv_lines[0].startswith("table,length,variant")
    assert len(csv_lines) == 1 + 5  # 2 lengths x 2 full variants + one windowed cell


def test_load_run_rejects_other_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(EvaluationError, match="bad.json"):
        load_run(bad)
