"""compare_runs: table and plot files next to the results; CLI helpers of evaluate.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kerple.evaluation.cli import write_json_atomic
from kerple.runs import RunError, parse_lengths
from kerple.evaluation.compare import compare
from kerple.evaluation.errors import EvaluationError


def write_result(folder: Path, pos_emb: str, seed: int, dataset: str, ppl: dict[int, float]) -> Path:
    doc = {
        "run": {"pos_emb": pos_emb, "dataset": dataset, "seed": seed, "train_seq_length": 512},
        "protocol": {"name": "nonoverlap", "attention_window": None},
        "results": [{"length": k, "loss": math.log(v), "ppl": v} for k, v in ppl.items()],
    }
    return write_json_atomic(doc, folder / f"{dataset}-{pos_emb}-{seed}.json")


def test_compare_groups_by_dataset_and_writes_next_to_results(tmp_path: Path) -> None:
    paths = []
    for seed in range(3):
        for dataset in ("github", "arxiv"):
            paths.append(write_result(tmp_path, "kerple_log", seed, dataset, {512: 3.4 + 0.1 * seed, 1024: 3.0 + 0.1 * seed}))
            paths.append(write_result(tmp_path, "rotary", seed, dataset, {512: [3.5, 3.4, 3.8][seed], 1024: 3.9 + 0.12 * seed}))
    text, written = compare(paths, reference="kerple_log", fmt="markdown")
    assert text.count("| Extrp. | KERPLE (log) | Rotary |") == 2
    assert "**arxiv (train length 512, nonoverlap)**" in text and "**github (train length 512, nonoverlap)**" in text
    # 1024: differences 0.9, 0.92, 0.94 -> t = 0.92 / (0.02 / sqrt(3)) = 79.7 > 4.303 (df 2): marked
    assert "| 1024 | 3.10 ± 0.10 | 4.02 ± 0.12† |" in text
    # 512: differences 0.1, -0.1, 0.2 -> t = 0.0667 / (0.1528 / sqrt(3)) = 0.76 < 4.303: no mark
    assert "| 512 | 3.50 ± 0.10 | 3.57 ± 0.21 |" in text
    names = sorted(p.name for p in written)
    assert names == [
        "comparison.md",
        "ppl_vs_length_arxiv_train_length_512_nonoverlap.png",
        "ppl_vs_length_github_train_length_512_nonoverlap.png",
    ]
    assert all(p.parent == tmp_path and p.stat().st_size > 0 for p in written)
    latex, _ = compare(paths, reference="kerple_log", fmt="latex", out_dir=tmp_path / "tex")
    assert (tmp_path / "tex" / "comparison.tex").read_text() == latex


def test_compare_refuses_a_missing_reference(tmp_path: Path) -> None:
    path = write_result(tmp_path, "alibi", 0, "github", {512: 3.0})
    with pytest.raises(EvaluationError, match="reference 'kerple_log' is not among the runs"):
        compare([path], reference="kerple_log")


def test_parse_lengths_and_atomic_json(tmp_path: Path) -> None:
    assert parse_lengths("1024,512,512", "--eval-lengths") == [512, 1024]
    with pytest.raises(RunError, match="--eval-lengths '512,1k': expected comma-separated integers"):
        parse_lengths("512,1k", "--eval-lengths")
    target = write_json_atomic({"a": [1, 2]}, tmp_path / "deep" / "r.json")
    assert json.loads(target.read_text()) == {"a": [1, 2]}
    assert [p.name for p in target.parent.iterdir()] == ["r.json"]


def test_two_files_of_one_seed_are_refused_not_silently_dropped(tmp_path: Path) -> None:
    """Two evaluations of one seed (re-evaluated, or seeds never set) made the mean one value short."""
    first = write_result(tmp_path, "kerple_log", 0, "github", {512: 3.0})
    (tmp_path / "again").mkdir()
    second = write_result(tmp_path / "again", "kerple_log", 0, "github", {512: 3.4})
    with pytest.raises(EvaluationError, match=r"again/github-kerple_log-0.json give kerple_log \(seed 0, github, "
                                              r"nonoverlap\) two perplexities at length 512 \(3 and 3.4\)"):
        compare([first, second], reference="kerple_log")
    # the same file named twice (overlapping globs) is read once; files of one run at other lengths merge,
    # and a copy with the same number (make demo's merged results beside their parts) counts once
    longer = write_result(tmp_path / "again", "kerple_log", 0, "github", {1024: 2.9, 512: 3.0})
    text, _ = compare([first, first, tmp_path / ".." / tmp_path.name / first.name, longer], reference="kerple_log",
                      fmt="csv")
    assert [line.split(",")[-6:-3] for line in text.splitlines()[1:]] == [["kerple_log", "3.0", "0.0"],
                                                                         ["kerple_log", "2.9", "0.0"]]


def test_cells_without_two_shared_seeds_say_no_test_was_made(tmp_path: Path) -> None:
    """With one seed, or seeds the reference lacks, no † can appear: the note said a t-test decided."""
    paths = [write_result(tmp_path, "kerple_log", seed, "github", {512: 3.0 + seed}) for seed in (0, 1)]
    paths += [write_result(tmp_path, "alibi", seed, "github", {512: 9.0 + 3 * seed}) for seed in (0, 1)]
    paths += [write_result(tmp_path, "rotary", seed, "github", {512: 9.0 + 3 * seed - 15}) for seed in (5, 6)]
    text, _ = compare(paths, reference="kerple_log", fmt="markdown")
    # differences 6, 8: t = 7 / (1.414 / sqrt(2)) = 7 < 12.71 (df 1): tested, not marked
    assert "| 512 | 3.50 ± 0.71 | 10.5 ± 2.1 | 10.5 ± 2.1 |" in text
    assert "ALiBi" not in text.split("no t-test")[1]
    assert "no t-test (fewer than two seeds shared with the reference at some length): Rotary\n" in text
    latex, _ = compare(paths[:2] + paths[4:], reference="kerple_log", fmt="latex")
    assert "% no t-test (fewer than two seeds shared with the reference at some length): Rotary" in latex


def test_a_folder_given_as_results_says_so(tmp_path: Path) -> None:
    with pytest.raises(EvaluationError, match=f"{tmp_path} is a folder; name the results JSON files in it"):
        compare([tmp_path])


def test_runs_that_scored_different_tokens_are_not_paired(tmp_path: Path) -> None:
    """A paired t-test over seeds (§5.2) compares perplexities of the same text: a run scored on the
    test split, on another token budget or with another sliding stride is refused, not averaged in."""
    def run(folder: str, seed: int, ppl: float, **protocol: object) -> Path:
        (tmp_path / folder).mkdir(exist_ok=True)
        path = write_result(tmp_path / folder, "alibi" if folder.startswith("c") else "kerple_log", seed, "github",
                            {512: ppl})
        doc = json.loads(path.read_text())
        doc["protocol"].update(protocol)
        return write_json_atomic(doc, path)

    reference = [run("r", seed, 3.0 + seed / 10, split="valid", num_tokens=32768) for seed in range(3)]
    other_split = [run("c1", seed, 3.5 + seed / 10, split="test", num_tokens=32768) for seed in range(3)]
    with pytest.raises(EvaluationError, match=r"r/github-kerple_log-0.json and \S+c1/github-alibi-0.json scored "
                                              r"different tokens \(split valid vs test\): their perplexities are not "
                                              r"paired; evaluate every run with the same --split"):
        compare([*reference, *other_split], reference="kerple_log")
    # no split key (a file from before it was recorded): valid
    other_budget = [run("c2", seed, 3.5 + seed / 10, num_tokens=16384) for seed in range(3)]
    with pytest.raises(EvaluationError, match=r"\(num_tokens 32768 vs 16384\)"):
        compare([*reference, *other_budget], reference="kerple_log")
    # the same tokens: paired and marked (differences 0.5, 0.55, 0.52: t = 35.9 > 4.303, df 2); a stride,
    # which nonoverlap does not read, is no difference
    same = [run("c3", seed, ppl, split="valid", num_tokens=32768, stride=256) for seed, ppl in enumerate([3.5, 3.65, 3.72])]
    text, _ = compare([*reference, *same], reference="kerple_log")
    assert "| 512 | 3.10 ± 0.10 | 3.62 ± 0.11† |" in text


def test_an_interrupted_evaluation_is_named_under_the_table(tmp_path: Path) -> None:
    """A results file with ``complete: false`` (evaluate.py stopped) went into the table without a word."""
    paths = [write_result(tmp_path, "kerple_log", 0, "github", {512: 3.4, 1024: 3.3}),
             write_result(tmp_path, "rotary", 0, "github", {512: 3.5})]
    doc = json.loads(paths[1].read_text())
    write_json_atomic({**doc, "complete": False}, paths[1])
    text, _ = compare(paths, reference="kerple_log", fmt="markdown")
    assert "| 1024 | 3.30 |  |" in text
    assert text.rstrip().endswith(f"Incomplete: evaluate.py stopped before scoring every length it was asked for in "
                                  f"{paths[1]}; run it again with the same --output for a complete file.")
    assert "Incomplete" not in compare(paths[:1], reference="kerple_log", fmt="markdown")[0]
    assert compare(paths, reference="kerple_log", fmt="latex")[0].rstrip().splitlines()[-1].startswith("% Incomplete:")
