"""``analyze.py`` as a user runs it: clear one-line errors (exit 2) and JSON + PNG outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kerple.analysis import cli
from kerple.evaluation import cli as evaluate_cli
from kerple.evaluation.temperature import temperature_for

REPO = Path(__file__).resolve().parents[3]
TINY = str(REPO / "configs/models/tiny.yml")


def error_line(capsys: pytest.CaptureFixture, prog: str = "analyze.py") -> str:
    errors = [line for line in capsys.readouterr().err.splitlines() if " -> " not in line]
    assert len(errors) == 1 and errors[0].startswith(f"{prog}: error: "), errors
    return errors[0]


def test_missing_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["attention-stats", TINY, str(REPO / "configs/pe/alibi.yml"), "--load", str(tmp_path / "nothing"),
            "--lengths", "64", "--output", str(tmp_path / "out.json")]
    assert cli.main(argv) == 2
    assert "no checkpoint" in error_line(capsys)
    assert not (tmp_path / "out.json").exists()


def test_length_beyond_a_learned_table_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["receptive-field", TINY, str(REPO / "configs/pe/learned.yml"), "--length", "4096",
            "--output", str(tmp_path / "rf.json")]
    assert cli.main(argv) == 2
    assert "learned table" in error_line(capsys)


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.2", "warm"])
def test_temperature_outside_zero_one_is_refused(bad: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["attention-stats", TINY, str(REPO / "configs/pe/alibi.yml"), "--lengths", "64", "--temperature", bad,
            "--output", str(tmp_path / "s.json")]
    assert cli.main(argv) == 2
    assert f"--temperature {bad!r}" in error_line(capsys)
    argv = [TINY, str(REPO / "configs/pe/alibi.yml"), "--eval-lengths", "64", "--softmax-temperature", bad,
            "--output", str(tmp_path / "e.json")]
    assert evaluate_cli.main(argv) == 2
    assert f"--softmax-temperature {bad!r}" in error_line(capsys, "evaluate.py")


def test_log_temperature_is_log_of_the_train_length_in_base_the_length() -> None:
    assert temperature_for("log", 512, 64) == pytest.approx(math.log(64) / math.log(512))  # = 2/3
    assert temperature_for("log", 4096, 64) == pytest.approx(0.5)
    assert temperature_for("log", 64, 64) == 1.0  # within the train length: the trained model
    assert temperature_for("0.8", 512, 64) == 0.8


def test_nope_variance_writes_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    output = tmp_path / "nope" / "variance.json"
    argv = ["nope-variance", TINY, str(REPO / "configs/pe/none.yml"), "--length", "32", "--samples", "20",
            "--output", str(output), "--no-progress"]
    assert cli.main(argv) == 0
    doc = json.loads(output.read_text())
    err = capsys.readouterr().err  # it printed only "wrote ...": the numbers, as the other analyses do
    lemma = "  ".join(f"m={m}: {doc['lemma'][m - 1]:.4g}" for m in (1, 8, 16, 32))
    assert f"Lemma 2.3: d²σ⁴/m: {lemma}" in err and "random model, σ = 0.02: m=1: " in err
    assert doc["format"] == "kerple-analysis-1" and len(doc["random_model"]) == len(doc["lemma"]) == 32
    assert doc["lemma"][0] == pytest.approx(128**2 * 0.02**4)  # d² σ⁴ / 1 with tiny.yml's d = 128
    assert output.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in output.parent.iterdir()) == ["variance.json", "variance.png"]  # no temp files left


@pytest.mark.parametrize("labels,expected", [
    ("a,b,c", "--labels names 3 run(s) (a,b,c) but --load gives 2"),
    ("a", "--labels names 1 run(s) (a) but --load gives 2"),
    ("a,a", "each run needs its own non-empty label (repeated or empty: 'a')"),
    ("a,", "each run needs its own non-empty label (repeated or empty: '')"),
])
def test_labels_must_name_each_load_once(tmp_path: Path, capsys: pytest.CaptureFixture, labels: str,
                                         expected: str) -> None:
    loads = ["--load", str(tmp_path / "run1"), "--load", str(tmp_path / "run2")]
    argv = ["receptive-field", TINY, *loads, "--labels", labels, "--length", "16", "--output", str(tmp_path / "rf.json")]
    assert cli.main(argv) == 2
    assert expected in error_line(capsys)
    assert not (tmp_path / "rf.json").exists()


def test_same_load_twice_without_labels_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    argv = ["receptive-field", TINY, "--load", str(run), "--load", f"{run}/", "--length", "16",
            "--output", str(tmp_path / "rf.json")]
    assert cli.main(argv) == 2
    assert "given twice; each run is one --load (or give --labels)" in error_line(capsys)


@pytest.mark.parametrize("flags,expected", [
    (["--depths", "a,b"], "--depths 'a,b': expected comma-separated fractions of the context in [0, 1]"),
    (["--depths", "0.5,1.5"], "--depths '0.5,1.5': expected comma-separated fractions of the context in [0, 1]"),
    (["--temperatures", ",,"], "--temperatures ',,': name at least one setting"),
])
def test_retrieval_settings_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     flags: list[str], expected: str) -> None:
    """A word for a depth traced back (ValueError); no temperature at all ran every prompt, then
    traced back in matplotlib with no file written."""
    argv = ["retrieval", TINY, str(REPO / "configs/pe/alibi.yml"), "--lengths", "256", *flags,
            "--output", str(tmp_path / "r.json")]
    assert cli.main(argv) == 2
    assert expected in error_line(capsys)
    assert not list(tmp_path.iterdir())



def test_nope_variance_of_another_embedding_says_the_lemma_is_about_nope(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """A kerple_log config drew a random kerple_log model and set it beside Lemma 2.3 without a word."""
    argv = ["nope-variance", TINY, str(REPO / "configs/pe/kerple_log.yml"), "--length", "8", "--samples", "4",
            "--output", str(tmp_path / "n.json"), "--no-progress"]
    assert cli.main(argv) == 0
    assert ("note: the random model has the config's kerple_log embedding; Lemma 2.3 describes NoPE"
            in capsys.readouterr().err)


def test_an_output_named_png_asks_for_the_json_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The refusal named --plot, a flag the user had not given."""
    argv = ["attention-stats", TINY, str(REPO / "configs/pe/alibi.yml"), "--lengths", "64",
            "--output", str(tmp_path / "stats.png")]
    assert cli.main(argv) == 2
    assert f"--output {tmp_path / 'stats.png'}: the JSON result goes there and its PNG beside it with .png; " \
        f"name a .json file, e.g. --output {tmp_path / 'stats.json'}" in error_line(capsys)
    assert not list(tmp_path.iterdir())
