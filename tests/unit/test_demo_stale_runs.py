"""``make demo`` reuses a finished run only when it was trained with the config it would use now."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerple.data.prepared import PreparedData
from kerple.jobs import analysis_demo, demo_runs

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = "data/demo/tokenizer.json"  # only named: loading a config does not read it


def finished_run(demo, tmp_path: Path, lr: str):
    """A finished demo run folder whose resolved config is the demo's own with ``lr`` changed."""
    from kerple.config import load_config, parse_overrides, split_arguments

    args = demo.parse_args(["--pos-emb", "alibi", "--steps", "5", "--runs", str(tmp_path / "runs")])
    data = PreparedData(prefix="data/x/x_text_document", split="90,10,0", tokenizer_file=str(TOKENIZER),
                        vocab_size=300)
    yamls, overrides = split_arguments(demo.config_args("alibi", args, data))
    overrides = [item for item in overrides if not item.startswith("lr=")] + [f"lr={lr}"]
    cfg = load_config([REPO / path for path in yamls], parse_overrides(overrides)).resolve_batch(1)  # as train.py saves it
    run = tmp_path / "runs" / "alibi"
    (run / "global_step5" / "configs").mkdir(parents=True)
    (run / "latest").write_text("global_step5\n")
    cfg.save_yaml(run / "global_step5" / "configs" / "resolved.yml")
    return args, data, run


def test_a_run_trained_with_another_config_is_set_aside(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    demo = demo_runs
    args, data, run = finished_run(demo, tmp_path, lr="0.5")
    demo.set_aside_stale_runs(args, data, ["alibi"])
    out = capsys.readouterr().out
    assert "trained with another config (optimizer.params.lr: 0.5 -> 0.003)" in out
    assert not run.exists()
    aside = [path.name for path in run.parent.iterdir()]
    assert len(aside) == 1 and aside[0].startswith("alibi.stale-")
    assert (run.parent / aside[0] / "latest").read_text() == "global_step5\n"  # nothing lost


def test_a_run_trained_with_this_config_is_reused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    demo = demo_runs
    args, data, run = finished_run(demo, tmp_path, lr=str(demo.parse_args([]).lr))
    assert demo.config_changes("alibi", args, data) == []
    demo.set_aside_stale_runs(args, data, ["alibi"])
    assert run.is_dir() and capsys.readouterr().out == ""


def test_a_run_finished_at_another_step_count_is_set_aside_not_resumed(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Resuming it with the demo's steps changed its schedule: train.py refused and the demo traced back."""
    demo = demo_runs
    _, data, run = finished_run(demo, tmp_path, lr="0.003")
    args = demo.parse_args(["--pos-emb", "alibi", "--steps", "8", "--runs", str(tmp_path / "runs")])
    demo.set_aside_stale_runs(args, data, ["alibi"])
    assert "its checkpoint is global_step5, not global_step8 of --steps 8" in capsys.readouterr().out
    assert not run.exists()


def test_analysis_demo_names_the_step_count_of_the_runs_it_found(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    """It said "no demo checkpoints" when make demo had run with other --steps."""
    data_dir = tmp_path / "data"
    (data_dir / "stdlib").mkdir(parents=True)
    (data_dir / "stdlib" / "stdlib_text_document.info.json").write_text("{}")
    for name in ("kerple_log", "alibi"):
        (tmp_path / "runs" / name / "global_step200").mkdir(parents=True)
        (tmp_path / "runs" / name / "latest").write_text("global_step200")
    argv = ["--runs", str(tmp_path / "runs"), "--data-dir", str(data_dir)]
    assert analysis_demo.main(argv) == 2
    err = capsys.readouterr().err
    assert "end at step 200 (kerple_log, alibi), not at step 400 (--steps 400)" in err
    assert "ANALYSIS_ARGS='--steps 200'" in err and err.count("\n") == 1
    assert analysis_demo.main([*argv, "--factor", "0"]) == 2
    assert "--factor 0: expected at least 1" in capsys.readouterr().err
