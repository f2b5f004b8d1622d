"""deepy.py: YAMLs and overrides are validated once; the script's own --flags reach every rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kerple.training import cli

REPO = Path(__file__).resolve().parents[3]


def launched(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> list[str]:
    calls: list[list[str]] = []
    monkeypatch.setattr(cli, "run_child", lambda command: calls.append(command) or 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli.deepy_main(argv) == 0
    assert len(calls) == 1
    return calls[0]


def test_evaluate_flags_pass_through_and_config_is_evaluation_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    configs = [str(REPO / "configs/models/tiny.yml"), str(REPO / "configs/pe/kerple_log.yml")]
    command = launched(monkeypatch, ["evaluate.py", *configs, f"log_dir={tmp_path}", "attention_impl=flex",
                                     "--load", "ckpt", "--eval-lengths", "128,256", "--per-position"])
    script = command.index("evaluate.py")
    resolved = Path(command[script + 1])
    assert command[script + 2:] == ["--load", "ckpt", "--eval-lengths", "128,256", "--per-position"]
    written = yaml.safe_load(resolved.read_text())
    # flex has no CPU backward, so this config only validates because nothing is trained.
    assert written["train_iters"] == 0 and written["attention_impl"] == "flex"


def test_training_launch_keeps_train_iters(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    configs = [str(REPO / "configs/models/tiny.yml"), str(REPO / "configs/pe/alibi.yml")]
    # tiny.yml saves to and loads from checkpoints/tiny: away from a Quick start run in the repository
    run = tmp_path / "checkpoints"
    command = launched(monkeypatch, ["train.py", *configs, f"log_dir={tmp_path}", f"save={run}", f"load={run}", "train_iters=7"])
    assert command[-2] == "train.py"
    assert yaml.safe_load(Path(command[-1]).read_text())["train_iters"] == 7


TINY = [str(REPO / "configs/models/tiny.yml"), str(REPO / "configs/pe/alibi.yml")]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([*TINY[:1], *TINY], "the first argument is the script to launch, got"),  # a YAML where the script goes
        (["train.py", *TINY, "--num_gpus=-2"], "--num_gpus -2: expected a positive integer"),
        (["train.py", *TINY, "--num_gpus", "3", "model_parallel_size=3", "num_attention_heads=2"],
         "model_parallel_size=3 (<command line>) must divide num_attention_heads=2"),
        (["train.py", *TINY, "--num_gpus", "1", "model_parallel_size=2"],
         "1 process(es) cannot be split into replicas"),
    ],
    ids=["yaml-as-script", "negative-gpus", "heads-not-divisible", "too-few-processes"],
)
def test_a_launch_that_cannot_run_is_refused_before_any_rank_starts(
    argv: list[str], expected: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(cli, "run_child", lambda command: pytest.fail(f"launched {command}"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli.deepy_main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("deepy.py: error: ") and expected in err[-1], err


def test_train_refuses_a_layout_its_one_process_cannot_run(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    from kerple.parallel import groups

    monkeypatch.setattr(groups, "prepare_environment", lambda: None)  # train.py imports it after --help
    assert cli.train_main([*TINY, "model_parallel_size=2"]) == 2
    assert "1 process(es) cannot be split" in capsys.readouterr().err


def test_the_resolved_config_keeps_the_users_files_and_keys(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """An error of train.py behind deepy.py named logs/resolved-config-*.yml instead of the user's YAML."""
    from kerple.config import load_config

    tiny = [str(REPO / "configs/models/tiny.yml"), str(REPO / "configs/pe/kerple_log.yml")]
    monkeypatch.setattr(cli, "run_child", lambda command: 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    user = tmp_path / "mine.yml"
    user.write_text("hidden-size: 64\nnum-attention-heads: 4\n")
    # tiny.yml saves to and loads from checkpoints/tiny: away from a Quick start run in the repository
    run = [f"save={tmp_path / 'checkpoints'}", f"load={tmp_path / 'checkpoints'}"]
    assert cli.deepy_main(["train.py", *tiny, str(user), "seq_length=96", f"log_dir={tmp_path / 'logs'}", *run]) == 0
    resolved = next((tmp_path / "logs").glob("resolved-config-*.yml"))
    cfg = load_config([str(resolved)])
    assert cfg.provenance("model.hidden_size") == (str(user), "hidden-size")
    assert cfg.provenance("model.seq_length") == ("<command line>", "seq_length")
    assert cfg.provenance("model.num_layers") == (tiny[0], "num-layers")
    assert cfg.provenance("optimizer.weight_decay")[0] in (tiny[0], "<default>")
    assert cfg.model.hidden_size == 64 and cfg.model.seq_length == 96


@pytest.mark.parametrize("existing", [False, True])
def test_a_refused_launch_leaves_no_run_folder(monkeypatch: pytest.MonkeyPatch, tmp_path, existing: bool) -> None:
    """train.py refusing its data (exit 2) left logs/resolved-config-*.yml in a new run folder; now the
    folder goes when deepy.py made it; in a folder that held a run already, nothing is removed."""
    tiny = [str(REPO / "configs/models/tiny.yml")]
    monkeypatch.setattr(cli, "run_child", lambda command: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    logs = tmp_path / "logs"
    if existing:
        logs.mkdir()
        (logs / "metrics.jsonl").write_text("{}\n")
    run = [f"save={tmp_path / 'checkpoints'}", f"load={tmp_path / 'checkpoints'}", f"log_dir={logs}"]
    assert cli.deepy_main(["train.py", *tiny, *run]) == 2
    if not existing:
        assert not logs.exists()
        return
    names = sorted(path.name for path in logs.iterdir())  # a run was there: its folder is not cleared
    assert len(names) == 2 and names[0] == "metrics.jsonl" and names[1].startswith("resolved-config-")


def test_fp16_without_a_gpu_is_refused_before_the_launch(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:
    """fp16 on the CPU accelerator was refused by every rank's train.py after deepy.py had written its
    resolved config and launched; now deepy.py refuses it first (exit 2) and writes nothing."""
    from kerple.parallel import groups

    monkeypatch.setattr(cli, "run_child", lambda command: pytest.fail(f"launched {command}"))
    monkeypatch.setattr(groups, "cuda_wanted", lambda: False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    run = [f"save={tmp_path / 'checkpoints'}", f"load={tmp_path / 'checkpoints'}", f"log_dir={tmp_path / 'logs'}"]
    fp16 = tmp_path / "fp16.yml"
    fp16.write_text("fp16: {enabled: true}\n")
    assert cli.deepy_main(["train.py", str(REPO / "configs/models/tiny.yml"), str(fp16), *run]) == 2
    assert "fp16 training needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def test_the_ranks_do_not_repeat_the_notes_deepy_printed(monkeypatch: pytest.MonkeyPatch, tmp_path, caplog) -> None:
    """The "accepted without effect" list printed twice: once by deepy.py, once more by every rank
    reading the resolved config. A user's own load of that file still prints it."""
    from kerple.config import load_config
    from kerple.config.loader import NOTES_SHOWN

    monkeypatch.delenv(NOTES_SHOWN, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    caplog.set_level("INFO", logger="kerple.config")
    ranks: list[int] = []

    def rank(command: list[str]) -> int:  # what train.py does first on each rank: load the resolved file
        load_config([command[-1]])
        ranks.append(1)
        return 0

    monkeypatch.setattr(cli, "run_child", rank)
    run = tmp_path / "checkpoints"
    argv = ["train.py", *TINY, f"log_dir={tmp_path}", f"save={run}", f"load={run}", "wall_clock_breakdown=true"]
    assert cli.deepy_main(argv) == 0 and ranks == [1]
    notes = [r.getMessage() for r in caplog.records if "accepted without effect" in r.getMessage()]
    assert len(notes) == 1 and "wall_clock_breakdown = true (<command line>)" in notes[0]
    caplog.clear()
    monkeypatch.delenv(NOTES_SHOWN)
    load_config([str(next(tmp_path.glob("resolved-config-*.yml")))])
    assert any("accepted without effect" in r.getMessage() for r in caplog.records)
