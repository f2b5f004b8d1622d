"""``analyze.py`` subcommands on a stored trained checkpoint (tests/fixtures) and a synthetic corpus."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kerple.analysis import cli
from kerple.data.indexed_dataset import IndexedDatasetWriter

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The fixture ``trainer-alibi``'s config as a YAML file, plus a corpus of its 32-token vocabulary."""
    folder = tmp_path_factory.mktemp("analysis")
    rng = np.random.RandomState(0)
    with IndexedDatasetWriter(folder / "corpus", dtype=np.uint16) as writer:
        for _ in range(40):
            writer.add_document(rng.randint(0, 31, size=int(rng.randint(30, 90))))
        writer.finalize()
    model = json.loads((FIXTURES / "manifest.json").read_text())["model"]
    config = {**model, "lr_decay_style": "cosine", "pos_emb": "alibi", "no_weight_tying": True,
              "data_path": str(folder / "corpus"), "split": "50,50,0"}
    (folder / "run.yml").write_text(json.dumps(config))
    return [str(folder / "run.yml"), "--load", str(FIXTURES / "trainer-alibi"), "--no-progress"], folder


def run(setup: tuple[list[str], Path], command: str, *options: str) -> dict:
    words, folder = setup
    output = folder / f"{command}.json"
    assert cli.main([command, *words, *options, "--output", str(output)]) == 0
    assert output.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    return json.loads(output.read_text())


def test_receptive_field(setup: tuple[list[str], Path]) -> None:
    doc = run(setup, "receptive-field", "--length", "24", "--num-sequences", "4")
    assert len(doc["cumulative"]) == 24 and doc["cumulative"][-1] == pytest.approx(1.0)
    assert 1 <= doc["erf"] <= 24 and doc["train_length"] == 8


def test_one_label_names_the_run_of_the_configs_load(setup: tuple[list[str], Path], capsys: pytest.CaptureFixture) -> None:
    """`make analysis-demo` names the run with a `load=` override and one --labels: one run, not a refusal."""
    words, folder = setup
    output = folder / "rf-labelled.json"
    argv = ["receptive-field", words[0], f"load={words[2]}", "--no-progress", "--labels", "mine", "--length", "16",
            "--num-sequences", "2", "--output", str(output)]
    assert cli.main(argv) == 0
    assert list(json.loads(output.read_text())["runs"]) == ["mine"]
    assert cli.main([*argv[:4], "--labels", "a,b", *argv[6:]]) == 2
    assert "(a,b) but without --load there is one run (the config's load)" in capsys.readouterr().err


def test_attention_stats_and_alignment(setup: tuple[list[str], Path]) -> None:
    doc = run(setup, "attention-stats", "--lengths", "8,32", "--num-sequences", "2")
    short, long = doc["lengths"]
    assert len(short["pmax"]) == 2 and len(short["pmax"][0]) == 2  # 2 layers x 2 heads
    assert all(0 < p <= 1 for row in long["pmax"] for p in row)
    doc = run(setup, "align-temperature", "--length", "32", "--mode", "pmax", "--num-sequences", "2")
    assert doc["temperature"] in [float(t) for t in doc["grid"]]
    assert doc["log_baseline"] == pytest.approx(np.log(8) / np.log(32))


def test_position_probe(setup: tuple[list[str], Path]) -> None:
    doc = run(setup, "position-probe", "--length", "8", "--num-sequences", "8")
    assert len(doc["mae"]) == 3 and all(error >= 0 for error in doc["mae"])


def test_position_probe_needs_a_window_to_fit_and_one_to_score(setup: tuple[list[str], Path],
                                                              capsys: pytest.CaptureFixture) -> None:
    """One window left none to score: every layer's MAE was NaN, written as a valid result."""
    words, folder = setup
    output = folder / "probe-one.json"
    argv = ["position-probe", *words, "--length", "8", "--num-sequences", "1", "--output", str(output)]
    assert cli.main(argv) == 2
    assert "--num-sequences 1: the probe is fitted on half the windows and scored on the other half; give at least 2" \
        in capsys.readouterr().err
    assert not output.exists() and not output.with_suffix(".png").exists()


def test_linear_probe_with_no_more_positions_than_weights_is_refused(setup: tuple[list[str], Path],
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Least squares on fewer rows than weights interpolates its fitting windows: the scored MAE was many
    times a constant guess's (271 tokens at L = 32 on a 128-wide model) and was written as a result."""
    words, folder = setup
    output = folder / "probe-few.json"
    argv = ["position-probe", *words, "--length", "8", "--num-sequences", "2", "--output", str(output)]
    assert cli.main(argv) == 2  # 1 fitting window x 8 positions against hidden_size 8 + 1 weights
    assert ("--num-sequences 2: the linear probe's 9 weights would be fitted on 8 positions; give at least "
            "--num-sequences 4 at --length 8") in capsys.readouterr().err
    assert not output.exists()


def test_evaluate_with_the_log_temperature(setup: tuple[list[str], Path]) -> None:
    """``--softmax-temperature log``: τ = 1 within the train length (same perplexity), log_L 8 beyond."""
    from kerple.evaluation import cli as evaluate_cli

    words, folder = setup
    results = {}
    for setting in ("1", "log"):
        output = folder / f"eval-{setting}.json"
        argv = [*words, "--eval-lengths", "8,32", "--num-windows", "4", "--softmax-temperature", setting,
                "--output", str(output)]
        assert evaluate_cli.main(argv) == 0
        results[setting] = json.loads(output.read_text())
    taus = results["log"]["protocol"]["softmax_temperature_per_length"]
    assert taus["8"] == 1.0 and taus["32"] == pytest.approx(np.log(8) / np.log(32))
    plain, tempered = ({r["length"]: r["ppl"] for r in results[s]["results"]} for s in ("1", "log"))
    assert tempered[8] == pytest.approx(plain[8], rel=1e-6)
    assert tempered[32] != pytest.approx(plain[32], rel=1e-4)


def run_with_configs(fixture: str, config_file: str, pos_emb: str, destination: Path) -> Path:
    """A copy of a fixture run whose checkpoint holds ``configs/resolved.yml`` (``config_file`` with ``pos_emb``)."""
    shutil.copytree(FIXTURES / fixture, destination)
    tag = (destination / "latest").read_text().strip()
    (destination / tag / "configs").mkdir()
    config = {**json.loads(Path(config_file).read_text()), "pos_emb": pos_emb}
    (destination / tag / "configs" / "resolved.yml").write_text(json.dumps(config))
    return destination


def test_load_without_yaml_reads_the_checkpoint_configs(setup: tuple[list[str], Path], tmp_path: Path) -> None:
    """As evaluate.py: ``--load DIR`` and no YAML takes the run's config from the checkpoint's configs/."""
    words, folder = setup
    run_dir = run_with_configs("trainer-alibi", words[0], "alibi", tmp_path / "run")
    with_yaml = run(setup, "attention-stats", "--lengths", "8,16", "--num-sequences", "2")
    output = folder / "from-checkpoint.json"
    assert cli.main(["attention-stats", "--load", str(run_dir), "--no-progress", "--lengths", "8,16",
                     "--num-sequences", "2", "--output", str(output)]) == 0
    assert json.loads(output.read_text())["lengths"] == with_yaml["lengths"]
    missing = folder / "missing.json"
    assert cli.main(["attention-stats", "--lengths", "8", "--output", str(missing)]) == 2  # no YAML, no --load
    assert not missing.exists()


def test_several_runs_without_yaml_each_use_their_own_config(setup: tuple[list[str], Path], tmp_path: Path) -> None:
    """receptive-field compares runs of different embeddings when each checkpoint names its own config."""
    words, folder = setup
    alibi = run_with_configs("trainer-alibi", words[0], "alibi", tmp_path / "alibi")
    rotary = run_with_configs("trainer-rotary", words[0], "rotary", tmp_path / "rotary")
    output = folder / "two-runs.json"
    assert cli.main(["receptive-field", "--load", str(alibi), "--load", str(rotary), "--length", "16",
                     "--num-sequences", "2", "--no-progress", "--output", str(output)]) == 0
    runs = json.loads(output.read_text())["runs"]
    assert sorted(runs) == sorted([str(alibi), str(rotary)])
    assert all(run["cumulative"][-1] == pytest.approx(1.0) for run in runs.values())
