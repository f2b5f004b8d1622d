"""Run-time options (``rope_scaling``: every option declared ``weights_bound=False``; ``finetune``):
``--dry-run`` builds the model with any of them, a checkpoint records them, a resume takes them or
refuses another value in one line, a re-run fine-tune continues instead of starting over, evaluation
takes the recorded value unless told otherwise, and the banner shows what is active."""

from __future__ import annotations

from pathlib import Path

import pytest

from kerple import positional
from kerple.config import ConfigError
from kerple.training import cli as training_cli
from kerple.training.trainer import Trainer, TrainingError
from tiny_run import REPO, corpus, parallel, tiny_config, train  # noqa: F401 (fixtures)

YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}
LINEAR = {"rope_type": "linear", "factor": 2.0}
HEAD_PAIRS = 16  # configs/models/tiny.yml: hidden 128 over 4 heads, 32 channels rotated


def runtime_examples() -> dict[str, list[str]]:
    """``key=value`` words for every run-time option; every rope_type for ``rope_scaling``."""
    ones = "[" + ", ".join(["1.0"] * HEAD_PAIRS) + "]"
    scalings = [
        "{rope_type: default}", "{rope_type: linear, factor: 2}", "{rope_type: dynamic, factor: 1}",
        "{rope_type: yarn, factor: 4, original_max_position_embeddings: 128}",
        f"{{rope_type: longrope, factor: 4, original_max_position_embeddings: 128, short_factor: {ones}, long_factor: {ones}}}",
        "{rope_type: llama3, factor: 4, original_max_position_embeddings: 128, low_freq_factor: 1, high_freq_factor: 4}",
        "{rope_type: proportional}",
    ]
    return {"rope_scaling": [f"rope_scaling={value}" for value in scalings], "attention_window": ["attention_window=16"]}


def dry_run_cases() -> list[str]:
    from kerple.checkpoint.runtime_options import runtime_idents

    examples = runtime_examples()
    assert set(runtime_idents()) <= set(examples), "add an example of the new run-time option"
    assert set(positional.runtime_option_names()) <= set(runtime_idents())
    return [word for words in examples.values() for word in words]


@pytest.mark.parametrize("word", dry_run_cases())
def test_dry_run_builds_the_model_with_every_run_time_option(word: str, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """The model is built on the meta device: the scaled frequencies are computed on the CPU first."""
    # tiny.yml saves to and loads from checkpoints/tiny: away from a Quick start run in the repository
    run = tmp_path / "checkpoints"
    argv = [str(REPO / "configs/models/tiny.yml"), str(REPO / "configs/pe/rotary.yml"), word, f"save={run}", f"load={run}",
            "--dry-run"]
    assert training_cli.train_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    name, value = word.split("=", 1)
    shown = value[: value.index(",")] if "," in value else value.rstrip("}")
    assert "parameters: " in out and f"{name} {shown}" in out.split("# run-time   ")[1]


@pytest.fixture(scope="module")
def yarn_run(parallel, corpus, tmp_path_factory) -> Path:  # noqa: F811
    """2 steps of rotary with YaRN, saved."""
    save = tmp_path_factory.mktemp("yarn") / "checkpoints"
    train(tiny_config(corpus, pos_emb="rotary", train_iters=2, lr_decay_iters=4, save=str(save), save_interval=2,
                      rope_scaling=YARN), parallel)
    return save


def read_recorded(folder: Path):
    from kerple.checkpoint.runtime_options import read_recorded as read

    return read(folder)


def test_the_checkpoint_records_its_run_time_options(yarn_run: Path) -> None:
    recorded = read_recorded(yarn_run)
    assert recorded is not None and recorded.options == {"rope_scaling": YARN, "attention_window": None}
    assert recorded.finetuned_from is None and recorded.where.endswith("global_step2")


def test_a_resume_without_the_option_takes_the_recorded_one(parallel, corpus, yarn_run: Path) -> None:  # noqa: F811
    cfg = tiny_config(corpus, pos_emb="rotary", train_iters=4, lr_decay_iters=4, load=str(yarn_run), save=str(yarn_run))
    trainer = Trainer(cfg.resolve_batch(1), parallel)
    try:
        assert trainer.iteration == 2 and cfg.positional.rope_scaling == YARN
        rotary = trainer.model.positional if hasattr(trainer.model, "positional") else None
        assert rotary is not None and rotary.rope_frequencies.rope_type == "yarn"  # the model was built with it
        assert cfg.source("rope_scaling").startswith("recorded in ")
    finally:
        trainer.close()


def test_a_resume_with_another_value_is_refused_in_one_line(parallel, corpus, yarn_run: Path) -> None:  # noqa: F811
    cfg = tiny_config(corpus, pos_emb="rotary", train_iters=4, lr_decay_iters=4, load=str(yarn_run), save=str(yarn_run),
                      rope_scaling=LINEAR)
    with pytest.raises(ConfigError) as refused:
        Trainer(cfg.resolve_batch(1), parallel)
    message = str(refused.value)
    assert refused.value.key == "rope_scaling" and "\n" not in message
    assert "was trained with rope_scaling {rope_type: yarn" in message and "finetune=true" in message


def test_an_attention_window_is_carried_like_the_scaling(parallel, corpus, tmp_path) -> None:  # noqa: F811
    """The window a run trained with is a run-time option too: a resume takes it, another is refused."""
    save = tmp_path / "windowed"
    train(tiny_config(corpus, train_iters=2, lr_decay_iters=4, save=str(save), attention_window=8), parallel)
    cfg = tiny_config(corpus, train_iters=4, lr_decay_iters=4, load=str(save), save=str(save))
    trainer = Trainer(cfg.resolve_batch(1), parallel)
    try:
        assert trainer.iteration == 2 and cfg.attention.attention_window == 8
    finally:
        trainer.close()
    other = tiny_config(corpus, train_iters=4, lr_decay_iters=4, load=str(save), save=str(save), attention_window=16)
    with pytest.raises(ConfigError, match="was trained with attention_window 8, not 16"):
        Trainer(other.resolve_batch(1), parallel)


def test_the_spelled_out_absence_of_scaling_is_no_difference(parallel, corpus, tmp_path) -> None:  # noqa: F811
    """A run trained without scaling resumes with ``{rope_type: default}``, which means the same."""
    save = tmp_path / "plain"
    train(tiny_config(corpus, pos_emb="rotary", train_iters=2, lr_decay_iters=4, save=str(save)), parallel)
    cfg = tiny_config(corpus, pos_emb="rotary", train_iters=4, lr_decay_iters=4, load=str(save), save=str(save),
                      rope_scaling={"rope_type": "default"})
    trainer = Trainer(cfg.resolve_batch(1), parallel)
    try:
        assert trainer.iteration == 2
    finally:
        trainer.close()


def test_a_fine_tune_keeps_its_own_options_and_a_rerun_continues_it(parallel, corpus, yarn_run, tmp_path) -> None:  # noqa: F811
    """finetune=true is a new run (the config's options, step 0); running its command again continues it
    from its save folder instead of starting over, and a save folder of another run is refused."""
    tuned = tmp_path / "tuned"
    keys = dict(pos_emb="rotary", lr_decay_iters=4, load=str(yarn_run), save=str(tuned), save_interval=2, finetune=True,
                rope_scaling=LINEAR)
    first = train(tiny_config(corpus, train_iters=2, **keys), parallel)
    assert first.losses[0][0] == 1
    assert read_recorded(tuned).finetuned_from == str(yarn_run.resolve())
    cfg = tiny_config(corpus, train_iters=4, **keys).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    try:
        assert trainer.iteration == 2 and cfg.checkpointing.load == str(tuned)
    finally:
        trainer.close()
    elsewhere = tmp_path / "elsewhere"
    train(tiny_config(corpus, pos_emb="rotary", train_iters=2, lr_decay_iters=4, save=str(elsewhere)), parallel)
    with pytest.raises(TrainingError, match="already holds .*not recorded as a fine-tune.*choose an empty save folder"):
        Trainer(tiny_config(corpus, train_iters=2, **{**keys, "save": str(elsewhere)}).resolve_batch(1), parallel)


def test_the_banner_shows_the_active_options(parallel, corpus, yarn_run, capsys) -> None:  # noqa: F811
    cfg = tiny_config(corpus, pos_emb="rotary", train_iters=2, lr_decay_iters=4, load=str(yarn_run), finetune=True)
    trainer = Trainer(cfg.resolve_batch(1), parallel)
    trainer.close()
    out = capsys.readouterr().out
    assert "(finetune: its weights only; step count, optimizer and schedule start over)" in out
    assert "run-time   rope_scaling none" in out
    assert "rope_scaling none here: " in out and "was trained with {rope_type: yarn" in out


def test_evaluation_takes_the_recorded_option_or_the_one_it_is_given(corpus, yarn_run, capsys) -> None:  # noqa: F811
    from kerple.runs import load_run

    cfg = tiny_config(corpus, pos_emb="rotary", train_iters=0)
    load_run(cfg, str(yarn_run))
    assert cfg.positional.rope_scaling == YARN
    assert "run-time: rope_scaling {rope_type: yarn" in capsys.readouterr().err
    zero_shot = tiny_config(corpus, pos_emb="rotary", train_iters=0, rope_scaling=LINEAR)
    load_run(zero_shot, str(yarn_run))
    assert zero_shot.positional.rope_scaling == LINEAR
    assert "was trained with {rope_type: yarn" in capsys.readouterr().err
