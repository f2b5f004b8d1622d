"""What a training run refuses or says before it writes: a missing ``load``, a finished run, a
``save`` folder another run holds, a half-pruned checkpoint, a corpus without a validation split."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kerple.checkpoint import files
from kerple.training.errors import TrainingError
from kerple.training.lock import LOCK_NAME, SaveLock
from kerple.training.trainer import Trainer
from tiny_run import REPO, corpus, parallel, tiny_config, tiny_overrides, train, write_corpus


def test_missing_load_is_an_error_unless_it_is_save(parallel, corpus: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-run"
    cfg = tiny_config(corpus, train_iters=2, load=str(missing), save=str(tmp_path / "out")).resolve_batch(1)
    with pytest.raises(TrainingError, match=r"load: .*no-such-run \(<command line>\) does not exist.*resume-or-start\): "
                                            r"set load=.*out \(the save folder\)"):
        Trainer(cfg, parallel)
    (tmp_path / "empty").mkdir()
    cfg = tiny_config(corpus, train_iters=2, load=str(tmp_path / "empty")).resolve_batch(1)
    with pytest.raises(TrainingError, match="holds no checkpoint"):
        Trainer(cfg, parallel)
    # load == save: the first run starts fresh, as GPT-NeoX's resume-or-start
    result = train(tiny_config(corpus, train_iters=2, load=str(missing), save=str(missing)), parallel)
    assert result.status == "finished" and (missing / "latest").read_text() == "global_step2"


def test_rerunning_a_finished_training_does_nothing(parallel, corpus: Path, tmp_path: Path, monkeypatch,
                                                    capsys) -> None:
    save = tmp_path / "run"
    settings = dict(train_iters=3, lr_decay_iters=3, save=str(save), load=str(save), eval_interval=2, eval_iters=1)
    settings.update(log_dir=str(tmp_path / "logs"), tensorboard_dir=str(tmp_path / "tensorboard"))
    first = train(tiny_config(corpus, **settings), parallel)
    assert first.status == "finished" and first.eval_losses
    final = save / "global_step3"
    written = {p: p.stat().st_mtime_ns for p in [*final.rglob("*"), *tmp_path.glob("logs/*"), *tmp_path.glob("tensorboard/*")]}
    again = train(tiny_config(corpus, **settings), parallel)
    assert again.status == "already finished" and again.iteration == 3
    assert again.eval_losses == [] and again.losses == [] and again.last_checkpoint == final
    # not even a TensorBoard event file or a metrics line (a second event file was written)
    assert {p: p.stat().st_mtime_ns for p in [*final.rglob("*"), *tmp_path.glob("logs/*"), *tmp_path.glob("tensorboard/*")]} == written
    argv = ["train.py", str(REPO / "configs/models/tiny.yml"),
            *[f"{key}={'' if value is None else value}" for key, value in tiny_overrides(corpus, **settings).items()]]
    from kerple.training import cli

    monkeypatch.setattr(cli, "run_child", lambda command: pytest.fail(f"launched {command}"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert cli.deepy_main(argv) == 0  # deepy says so too, and writes no resolved config
    assert f"deepy: training already finished: {final} is step 3 of 3" in capsys.readouterr().out
    assert not list((tmp_path / "logs").glob("resolved-config-*"))


def test_two_trainings_cannot_share_a_save_folder(parallel, corpus: Path, tmp_path: Path) -> None:
    save = tmp_path / "shared"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from kerple.training.lock import SaveLock; "
         f"lock = SaveLock({str(save)!r}); print('locked', flush=True); time.sleep(60)"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = tiny_config(corpus, train_iters=2, save=str(save)).resolve_batch(1)
        trainer = Trainer(cfg, parallel)
        try:
            with pytest.raises(TrainingError, match=rf"another training \(pid {holder.pid}\) is writing checkpoints"):
                trainer.train()
        finally:
            trainer.close()
        assert not (save / "latest").exists()
    finally:
        holder.kill()
        holder.wait()
    with SaveLock(save):  # the lock died with its holder
        assert (save / LOCK_NAME).read_text() == str(os.getpid())
    assert not (save / LOCK_NAME).exists()


def test_a_prune_killed_mid_delete_leaves_no_checkpoint_behind(tmp_path: Path, monkeypatch) -> None:
    for step in (2, 4, 6):
        (tmp_path / f"global_step{step}").mkdir()
        (tmp_path / f"global_step{step}" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (tmp_path / "latest").write_text("global_step6")

    def killed(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        raise KeyboardInterrupt

    monkeypatch.setattr(files.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        files.prune_checkpoints(tmp_path, keep_last_n=1)
    assert files.list_checkpoints(tmp_path) == [6]  # no half-deleted global_step2/4 counts
    monkeypatch.undo()
    files.prune_checkpoints(tmp_path, keep_last_n=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step6", "latest"]


def test_a_corpus_without_a_validation_split_warns(parallel, tmp_path: Path, caplog) -> None:
    small = write_corpus(tmp_path / "small", documents=30)
    cfg = tiny_config(small, train_iters=1, split="99,1,0", eval_iters=1).resolve_batch(1)
    with caplog.at_level(logging.WARNING, logger="kerple"):
        trainer = Trainer(cfg, parallel)
        trainer.close()
    assert "validation split" in caplog.text and "'99,1,0'" in caplog.text and "without validation" in caplog.text


def test_separate_training_files_without_validation_files_say_which_key_to_set(parallel, tmp_path: Path,
                                                                              caplog) -> None:
    """The warning named 'the validation split of None': with train_data_paths no split string is read."""
    small = write_corpus(tmp_path / "small", documents=30)
    cfg = tiny_config(small, train_iters=1, eval_iters=1, data_path=None, train_data_paths=[str(small)]).resolve_batch(1)
    with caplog.at_level(logging.WARNING, logger="kerple"):
        trainer = Trainer(cfg, parallel)
        trainer.close()
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "valid_data_paths" in warnings and "without validation" in warnings and "None" not in warnings


def test_a_test_split_shorter_than_a_sample_does_not_stop_training(parallel, tmp_path: Path) -> None:
    """The trainer never reads the test split (evaluate.py does), so it does not build it: a test part
    of one document (at most 120 tokens) once refused every seq_length above it."""
    small = write_corpus(tmp_path / "small", documents=100)
    cfg = tiny_config(small, train_iters=1, split="90,9,1", seq_length=128, max_position_embeddings=128).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    trainer.close()


def test_a_diverged_run_names_a_checkpoint_only_where_there_is_one(parallel, corpus: Path, tmp_path: Path) -> None:
    """It said "the last good checkpoint is in DIR" of a folder that held none."""
    from kerple.training.errors import TrainingDivergedError

    save = tmp_path / "run"
    with pytest.raises(TrainingDivergedError) as raised:
        train(tiny_config(corpus, train_iters=20, lr=1e30, warmup=0.0, save=str(save)), parallel)
    assert "no checkpoint was written yet (save_interval 1000); the run starts over from step 0" in str(raised.value)
    assert not (save / "latest").exists()
    train(tiny_config(corpus, train_iters=2, lr_decay_iters=2, save=str(save), load=str(save)), parallel)
    with pytest.raises(TrainingDivergedError) as raised:
        train(tiny_config(corpus, train_iters=20, lr=1e30, warmup=0.0, save=str(save), load=str(save),
                          override_lr_scheduler=True), parallel)
    assert f"the last good checkpoint is {save / 'global_step2'}" in str(raised.value)


def test_a_new_save_folder_with_an_old_load_says_to_set_load_too(parallel, corpus: Path, tmp_path: Path) -> None:
    """`save=new` alone, with a YAML's `load` naming a kerple_log run and `pos_emb` alibi, said to use the
    old checkpoint's config, which would continue the old run rather than start the new one."""
    old, new = tmp_path / "tiny", tmp_path / "tiny_alibi"
    train(tiny_config(corpus, train_iters=2, lr_decay_iters=2, save=str(old), load=str(old)), parallel)
    cfg = tiny_config(corpus, train_iters=2, pos_emb="alibi", save=str(new), load=str(old)).resolve_batch(1)
    with pytest.raises(TrainingError) as raised:
        Trainer(cfg, parallel)
    message = str(raised.value)
    assert f"load: {old} (<command line>) is another run than save: {new} (<command line>)" in message
    assert f"To start a new run in {new}, set load={new} too (resume-or-start)" in message and "pos_emb" in message
    assert not new.exists() or not list(new.iterdir())


def test_the_first_step_is_reported_at_once(parallel, corpus: Path, tmp_path: Path, capsys) -> None:
    train(tiny_config(corpus, train_iters=3, log_interval=100, save=str(tmp_path / "run")), parallel)
    steps = [line.split("|")[0].split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert steps == ["1/3", "3/3"]  # then every log_interval and the last


def test_a_decay_length_from_a_file_that_the_run_does_not_reach_is_said(corpus: Path) -> None:
    from kerple.training.summary import decay_note

    note = decay_note(tiny_config(corpus, train_iters=30, lr_decay_iters=200))
    assert "lr_decay_iters=200 (<command line>) differs from train_iters=30: the run stops before the decay ends" in note
    assert "set lr_decay_iters=30" in note
    assert decay_note(tiny_config(corpus, train_iters=30)) == ""  # unset: NeoX's default, decay over train_iters
    # past the decay the rate is not min_lr (0) but where the fork's AnnealingLR stops changing, at step
    # 200 - 0.05 x 200 = 190: lr/2 (cos(pi (190 - 10) / 200) + 1) with lr 3e-3 (docs/reference-format.md §5)
    frozen = 3e-3 / 2 * (math.cos(math.pi * 180 / 200) + 1)
    assert f"{frozen:.3g}" == "7.34e-05"
    assert "the run keeps lr 7.34e-05 from step 190 (lr_decay_iters - warm-up) to the end" in decay_note(
        tiny_config(corpus, train_iters=300, lr_decay_iters=200))


def test_a_resumed_schedule_says_what_it_follows(parallel, corpus: Path, tmp_path: Path, capsys) -> None:
    """With use_checkpoint_lr_scheduler and a new train_iters the banner said "cosine over 120" while
    the rate followed the checkpoint's 200-step schedule."""
    save = tmp_path / "run"
    train(tiny_config(corpus, train_iters=2, lr_decay_iters=200, save=str(save), load=str(save)), parallel)
    capsys.readouterr()
    cfg = tiny_config(corpus, train_iters=4, lr_decay_iters=None, save=str(save), load=str(save),
                      use_checkpoint_lr_scheduler=True).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    trainer.close()
    schedule = capsys.readouterr().out.split("  schedule   ")[1].split("\n  data")[0]
    assert schedule.startswith("4 steps from 2, lr 0.003 cosine over 200 (")
    assert "the checkpoint's schedule (use_checkpoint_lr_scheduler), not the config's lr 0.003 cosine over 4" in schedule
    assert "its decay over 200 differs from train_iters=4: the run stops before the decay ends" in schedule


def test_train_iters_0_evaluates_a_trained_run_without_a_schedule_check(parallel, corpus: Path, tmp_path: Path,
                                                                           capsys) -> None:
    """The reference's evaluation recipe (train_iters: 0 on a checkpoint) and a lowered train_iters
    were refused: the schedule derived from the new train_iters differed from the checkpoint's."""
    save = tmp_path / "run"
    settings = dict(lr_decay_iters=None, save=str(save), load=str(save), eval_iters=1)
    train(tiny_config(corpus, train_iters=3, **settings), parallel)
    written = sorted(save.rglob("*"))
    capsys.readouterr()
    evaluated = train(tiny_config(corpus, train_iters=0, seq_length_val=64, **settings), parallel)
    assert evaluated.status == "finished" and evaluated.iteration == 3 and len(evaluated.eval_losses) == 1
    assert evaluated.losses == [] and sorted(save.rglob("*")) == written  # no step, no new checkpoint
    assert "schedule   none: train_iters 0 evaluates the model at step 3 and trains no step" in capsys.readouterr().out
    lowered = train(tiny_config(corpus, train_iters=2, **settings), parallel)
    assert lowered.status == "already finished" and lowered.iteration == 3


def test_resuming_a_converted_checkpoint_says_the_optimizer_starts_fresh(parallel, corpus: Path, tmp_path: Path,
                                                                         capsys) -> None:
    """A conversion keeps weights and iteration only; resuming from it restarted Adam without a word."""
    from kerple.checkpoint.convert import main as convert_main

    settings = dict(lr_decay_iters=10, eval_iters=1)
    train(tiny_config(corpus, train_iters=2, save=str(tmp_path / "run"), load=str(tmp_path / "run"), **settings), parallel)
    assert convert_main([str(tmp_path / "run"), str(tmp_path / "converted"), "--to", "kerple"]) == 0
    capsys.readouterr()
    converted = tmp_path / "converted"
    result = train(tiny_config(corpus, train_iters=3, save=str(converted), load=str(converted), **settings), parallel)
    assert result.status == "finished" and result.iteration == 3
    assert (f"note: {converted / 'global_step2'} holds no optimizer state (a converted checkpoint, or one saved with "
            "no_save_optim); weights and iteration loaded, optimizer state starts fresh, the learning rate follows "
            "the config's schedule") in capsys.readouterr().out
    capsys.readouterr()
    train(tiny_config(corpus, train_iters=4, save=str(converted), load=str(converted), **settings), parallel)
    assert "holds no optimizer state" not in capsys.readouterr().out  # its own checkpoint at step 3 has one
