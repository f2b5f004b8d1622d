"""evaluate.py end to end on a checkpoint that train.py wrote."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "training"))

from kerple.evaluation import cli  # noqa: E402
from tiny_run import REPO, tiny_overrides, write_corpus  # noqa: E402

LENGTHS = "32,64,128"


def as_arguments(overrides: dict) -> list[str]:
    return [f"{key}={'' if value is None else value}" for key, value in overrides.items()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A 20-step kerple_log checkpoint and the config arguments that describe it."""
    root = tmp_path_factory.mktemp("evaluate")
    corpus = write_corpus(root / "corpus", documents=400)
    checkpoints = root / "ckpt"
    overrides = tiny_overrides(
        corpus, train_iters=20, lr_decay_iters=20, save=str(checkpoints), save_interval=20, num_workers=0
    )
    arguments = ["configs/models/tiny.yml", *as_arguments(overrides)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "train.py", *arguments], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return checkpoints, arguments


def evaluate(trained: tuple[Path, list[str]], output: Path, *extra: str) -> dict:
    checkpoints, arguments = trained
    argv = [*arguments, "--load", str(checkpoints), "--output", str(output), "--no-progress", *extra]
    assert cli.main([str(REPO / a) if a.endswith(".yml") else a for a in argv]) == 0
    return json.loads(output.read_text())


def test_evaluate_py_nonoverlap_is_repeatable(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    checkpoints, arguments = trained
    output = tmp_path / "a.json"
    done = subprocess.run(
        [sys.executable, "evaluate.py", *arguments, "--load", str(checkpoints), "--eval-lengths", LENGTHS,
         "--per-position", "--output", str(output)],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "length  windows" in done.stdout
    first = json.loads(output.read_text())
    assert first["run"]["pos_emb"] == "kerple_log" and first["run"]["iteration"] == 20
    assert first["run"]["dataset"] == "corpus" and first["run"]["train_seq_length"] == 32
    rows = first["results"]
    assert [r["length"] for r in rows] == [32, 64, 128]
    assert len({r["scored_tokens"] for r in rows}) == 1  # the same tokens at every length
    assert [r["num_windows"] * r["length"] for r in rows] == [r["scored_tokens"] for r in rows]
    for row in rows:
        assert row["ppl"] == pytest.approx(math.exp(row["loss"]))
        assert math.log(64) * 0.3 < row["loss"] < math.log(64) * 1.5  # trained, vocab 64
        assert sum(row["per_position_loss"]) / row["length"] == pytest.approx(row["loss"], rel=1e-9)
    again = evaluate(trained, tmp_path / "b.json", "--eval-lengths", LENGTHS, "--per-position")
    assert again["results"] == [{**r, "seconds": s["seconds"]} for r, s in zip(rows, again["results"])]


def test_sliding_and_last_token(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    sliding = evaluate(trained, tmp_path / "s.json", "--eval-lengths", "32,64", "--protocol", "sliding", "--stride", "16")
    assert sliding["protocol"]["name"] == "sliding" and sliding["protocol"]["stride"] == 16
    assert len({r["scored_tokens"] for r in sliding["results"]}) == 1
    last = evaluate(trained, tmp_path / "l.json", "--eval-lengths", LENGTHS, "--protocol", "last_token")
    counts = {r["scored_tokens"] for r in last["results"]}
    assert counts == {r["num_windows"] for r in last["results"]} and len(counts) == 1
    assert [r["input_length"] for r in last["results"]] == [31, 63, 127]


def test_windowed_attention_changes_only_long_lengths(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    plain = evaluate(trained, tmp_path / "p.json", "--eval-lengths", LENGTHS)
    windowed = evaluate(trained, tmp_path / "w.json", "--eval-lengths", LENGTHS, "--attention-window", "32")
    assert windowed["protocol"]["attention_window"] == 32
    assert windowed["results"][0]["loss"] == pytest.approx(plain["results"][0]["loss"], rel=1e-6)
    assert windowed["results"][2]["loss"] != pytest.approx(plain["results"][2]["loss"], rel=1e-6)


def test_cache_window_matches_attention_window(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    """A W-entry KV cache equals full attention when W covers the window and equals the
    attention_window=W mask otherwise (thesis §4.9.2)."""
    plain = evaluate(trained, tmp_path / "p.json", "--eval-lengths", "32,64")
    masked = evaluate(trained, tmp_path / "m.json", "--eval-lengths", "32,64", "--attention-window", "32")
    cached = evaluate(trained, tmp_path / "c.json", "--eval-lengths", "32,64", "--cache-window", "32")
    assert cached["protocol"]["cache_window"] == 32
    assert cached["results"][0]["loss"] == pytest.approx(plain["results"][0]["loss"], rel=1e-5)
    assert cached["results"][1]["loss"] == pytest.approx(masked["results"][1]["loss"], rel=1e-5)
    assert cached["results"][1]["loss"] != pytest.approx(plain["results"][1]["loss"], rel=1e-5)


def test_auto_implementation_is_resolved_per_length(trained: tuple[Path, list[str]], tmp_path: Path) -> None:
    plain = evaluate(trained, tmp_path / "p.json", "--eval-lengths", "32,64")
    auto = evaluate(trained, tmp_path / "a.json", "--eval-lengths", "32,64", "--attention-impl", "auto")
    # Short CPU evaluations of a bias kernel pick sdpa (flex only from 2048 tokens on CPU).
    assert auto["protocol"]["attention_impl_per_length"] == {"32": "sdpa", "64": "sdpa"}
    for a, b in zip(auto["results"], plain["results"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_refusals_exit_2_with_a_reason(
    trained: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    checkpoints, arguments = trained
    base = [str(REPO / a) if a.endswith(".yml") else a for a in arguments]
    common = ["--load", str(checkpoints), "--output", str(tmp_path / "x.json"), "--no-progress"]
    learned = [*base, "pos_emb=learned", "--eval-lengths", "32,128", *common]
    assert cli.main([a for a in learned if a != "pos_emb=kerple_log"]) == 2
    assert "max_position_embeddings" in capsys.readouterr().err
    monkeypatch.setattr(cli, "available_bytes", lambda device: 1_000_000)
    assert cli.main([*base, "--eval-lengths", "128", *common]) == 2
    assert "does not fit in memory" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
