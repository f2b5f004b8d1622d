"""Checkpoints: reference layout (docs/reference-format.md §6), exact resume, atomicity, and refusals."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch

from kerple.config import ConfigError
from kerple.data.errors import DataError
from kerple.model import build_model
from kerple import atomic
from kerple import checkpoint as ckpt
from kerple.checkpoint import NeoxAdapter
from kerple.training.trainer import Trainer, TrainingDivergedError, TrainingError
from tiny_run import corpus, parallel, tiny_config, train


@pytest.fixture(scope="module")
def saved_run(parallel, corpus, tmp_path_factory) -> Path:
    """4 steps of kerple_log, saving every 2 steps and keeping the last one."""
    save = tmp_path_factory.mktemp("run") / "checkpoints"
    cfg = tiny_config(corpus, train_iters=4, lr_decay_iters=8, save=str(save), save_interval=2, keep_last_n_checkpoints=1)
    train(cfg, parallel)
    return save


def test_reference_layout_and_contents(saved_run: Path) -> None:
    assert (saved_run / "latest").read_text() == "global_step4"
    assert sorted(p.name for p in saved_run.iterdir()) == ["global_step4", "latest"]  # pruned, no temp dirs
    step = saved_run / "global_step4"
    layer_files = sorted(p.name for p in step.glob("layer_*"))
    # 2 layers: embedding 0, layers 2-3, final norm 5, head 6; indices 1 and 4 have no file
    assert layer_files == [f"layer_{i:02d}-model_00-model_states.pt" for i in (0, 2, 3, 5, 6)]
    embedding = ckpt.safe_torch_load(step / layer_files[0])
    assert set(embedding) == {"word_embeddings.weight"}
    layer2, layer3 = (ckpt.safe_torch_load(step / layer_files[i]) for i in (1, 2))
    for key in ("input_layernorm.weight", "attention.query_key_value.weight", "attention.dense.bias",
                "mlp.dense_h_to_4h.weight", "mlp.dense_4h_to_h.bias", "attention.rpe.bias_p", "attention.rpe.bias_a"):
        assert key in layer2, key
    assert torch.equal(layer2["attention.rpe.bias_p"], layer3["attention.rpe.bias_p"])  # shared copy in every file
    assert set(ckpt.safe_torch_load(step / layer_files[3])) == {"norm.weight", "norm.bias"}
    assert set(ckpt.safe_torch_load(step / layer_files[4])) == {"final_linear.weight"}

    meta = ckpt.safe_torch_load(step / "mp_rank_00_model_states.pt")  # weights_only: no code runs
    assert meta["iteration"] == 4 and meta["module"] is None
    assert meta["consumed_train_samples"] == 16
    assert meta["args"]["num_layers"] == 2 and meta["args"]["pos_emb"] == "kerple_log"
    assert meta["args"]["padded_vocab_size"] == 64
    for key in ("random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state"):
        assert key in meta
    assert meta["lr_scheduler"]["num_iters"] == 4
    assert meta["optimizer"]["state"], "Adam moments are saved"
    assert (step / "configs" / "resolved.yml").is_file()


def test_load_model_weights_returns_iteration(saved_run: Path, corpus: Path) -> None:
    model = build_model(tiny_config(corpus))
    assert ckpt.load_model_weights(model, saved_run) == 4
    saved = ckpt.safe_torch_load(saved_run / "global_step4" / "layer_06-model_00-model_states.pt")
    reference = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    assert torch.equal(reference["sequential.6.final_linear.weight"], saved["final_linear.weight"])
    with pytest.raises(ckpt.CheckpointError, match=r"no checkpoint .*global_step2.*available"):
        ckpt.load_model_weights(model, saved_run, iteration=2)


def test_exact_resume_matches_uninterrupted(parallel, corpus: Path, tmp_path: Path) -> None:
    common = dict(lr_decay_iters=8, hidden_dropout=0.1, attention_dropout=0.1)  # dropout exercises the RNG state
    straight = train(tiny_config(corpus, train_iters=8, **common), parallel)
    save = tmp_path / "ck"
    first = train(tiny_config(corpus, train_iters=4, save=str(save), **common), parallel)
    second = train(tiny_config(corpus, train_iters=8, save=str(save), load=str(save), **common), parallel)
    resumed = first.losses + second.losses
    assert [s for s, _ in resumed] == list(range(1, 9))
    assert [loss for _, loss in resumed] == [loss for _, loss in straight.losses]


def _fork_annealing_lr(step: int, lr: float, warmup: float, decay: int, min_lr: float) -> float:
    """The KERPLE fork's ``AnnealingLR.get_lr`` (cosine), restated from docs/reference-format.md §5."""
    warmup_iters = warmup * decay
    clamped = min(step, decay - warmup_iters)
    if step <= warmup_iters:
        return lr * clamped / warmup_iters
    return max(lr / 2 * (math.cos(math.pi * (clamped - warmup_iters) / decay) + 1), min_lr)


def _train_records(log_dir: Path) -> dict[int, dict[str, float]]:
    lines = (json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines())
    return {record["step"]: record for record in lines if "train/lm_loss" in record}


def test_resume_mid_warmup_with_accumulation_follows_the_reference_schedule(parallel, corpus: Path,
                                                                            tmp_path: Path) -> None:
    """3 micro-batches per step, a resume inside the warm-up, a run past lr_decay_iters: the logged
    rate of step n is the fork's schedule after n - 1 steps (the rate step n trained with), the
    samples consumed are n x 2 x 3, and the resumed run's losses are the uninterrupted run's."""
    common = dict(gradient_accumulation_steps=3, train_micro_batch_size_per_gpu=2, lr=3e-3, min_lr=1e-4,
                  warmup=0.25, lr_decay_iters=12, lr_decay_style="cosine", log_interval=1, hidden_dropout=0.1)
    straight = train(tiny_config(corpus, train_iters=14, log_dir=str(tmp_path / "a"), **common), parallel)
    save, resumed_logs = tmp_path / "ck", tmp_path / "b"
    first = train(tiny_config(corpus, train_iters=2, save=str(save), log_dir=str(resumed_logs), **common), parallel)
    second = train(tiny_config(corpus, train_iters=14, save=str(save), load=str(save), log_dir=str(resumed_logs),
                               **common), parallel)
    assert first.losses + second.losses == straight.losses
    logged, again = _train_records(tmp_path / "a"), _train_records(resumed_logs)
    assert sorted(logged) == sorted(again) == list(range(1, 15))
    for step, record in logged.items():
        expected = _fork_annealing_lr(step - 1, 3e-3, 0.25, 12, 1e-4)
        assert record["train/learning_rate"] == pytest.approx(expected, rel=1e-12, abs=1e-15), step
        assert again[step]["train/learning_rate"] == record["train/learning_rate"], step
        assert record["train/consumed_samples"] == again[step]["train/consumed_samples"] == step * 6
    # warm-up 0.25 x 12 = 3 steps; the rate stops changing after 12 - 3 = 9 steps, at lr/2 (cos(pi 6/12) + 1)
    assert [logged[step]["train/learning_rate"] for step in (1, 2, 4)] == pytest.approx([0.0, 1e-3, 3e-3])
    assert logged[14]["train/learning_rate"] == pytest.approx(1.5e-3)


def test_architecture_mismatch_names_fields(parallel, corpus: Path, saved_run: Path) -> None:
    cfg = tiny_config(corpus, hidden_size=48, pos_emb="alibi", load=str(saved_run))
    cfg.resolve_batch(1)
    with pytest.raises(ckpt.ArchitectureMismatchError) as error:
        Trainer(cfg, parallel)
    assert "hidden_size: checkpoint 32 vs config 48" in str(error.value)
    assert "pos_emb" in str(error.value)


def test_finetune_loads_weights_only(parallel, corpus: Path, saved_run: Path) -> None:
    cfg = tiny_config(corpus, load=str(saved_run), finetune=True).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    try:
        assert trainer.iteration == 0 and trainer.consumed_train_samples == 0
        assert not trainer.engine.optimizer.state_dict()["state"]  # fresh optimizer
        saved = ckpt.safe_torch_load(saved_run / "global_step4" / "layer_00-model_00-model_states.pt")
        reference = NeoxAdapter.for_model(trainer.model).to_reference(trainer.model.state_dict())
        assert torch.equal(reference["sequential.0.word_embeddings.weight"], saved["word_embeddings.weight"])
    finally:
        trainer.close()


def test_no_load_optim_keeps_iteration_but_fresh_moments(parallel, corpus: Path, saved_run: Path) -> None:
    cfg = tiny_config(corpus, load=str(saved_run), no_load_optim=True).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    try:
        assert trainer.iteration == 4
        assert not trainer.engine.optimizer.state_dict()["state"]
        assert trainer.scheduler.num_steps == 4
    finally:
        trainer.close()


def test_fp16_on_cpu_is_refused_clearly(parallel, corpus: Path) -> None:
    cfg = tiny_config(corpus, fp16={"enabled": True}).resolve_batch(1)
    with pytest.raises(TrainingError, match="fp16 training needs a CUDA GPU.*bf16"):
        Trainer(cfg, parallel)


def test_missing_data_path_names_the_file(parallel, corpus: Path, tmp_path: Path) -> None:
    cfg = tiny_config(corpus, data_path=str(tmp_path / "nowhere" / "corpus")).resolve_batch(1)
    with pytest.raises(DataError, match="nowhere"):
        Trainer(cfg, parallel)


def test_batch_that_does_not_divide_is_a_config_error(corpus: Path) -> None:
    with pytest.raises(ConfigError, match="train_batch_size"):
        tiny_config(corpus, train_batch_size=10, gradient_accumulation_steps=None).resolve_batch(1)


def test_nan_loss_stops_without_saving(parallel, corpus: Path, tmp_path: Path, monkeypatch) -> None:
    """The loss is read on the host at log and save steps only: a NaN at step 3 is found before the
    save at step 4, which is not written, and the error names step 3."""
    import kerple.model.decoder as decoder

    calls = {"n": 0}
    real = decoder.linear_cross_entropy

    def poisoned(hidden, weight, labels, **options):
        calls["n"] += 1
        value = real(hidden, weight, labels, **options)
        return value * float("nan") if calls["n"] >= 3 else value

    monkeypatch.setattr(decoder, "linear_cross_entropy", poisoned)
    save = tmp_path / "ck"
    cfg = tiny_config(corpus, train_iters=6, save=str(save), save_interval=2)
    with pytest.raises(TrainingDivergedError, match="loss is nan at step 3"):
        train(cfg, parallel)
    assert (save / "latest").read_text() == "global_step2"
    assert sorted(p.name for p in save.iterdir()) == ["global_step2", "latest"]


def test_disk_full_leaves_previous_checkpoint(parallel, corpus: Path, tmp_path: Path, monkeypatch) -> None:
    save = tmp_path / "ck"
    real_save = atomic.torch_save_atomic

    def failing(obj, path: Path) -> None:
        if "global_step4" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, path)

    monkeypatch.setattr(atomic, "torch_save_atomic", failing)
    cfg = tiny_config(corpus, train_iters=4, save=str(save), save_interval=2)
    with pytest.raises(ckpt.CheckpointError, match="No space left.*latest still names global_step2"):
        train(cfg, parallel)
    assert (save / "latest").read_text() == "global_step2"
    assert sorted(p.name for p in save.iterdir()) == ["global_step2", "latest"]
    model = build_model(tiny_config(corpus))
    assert ckpt.load_model_weights(model, save) == 2


def test_sigterm_finishes_step_saves_and_stops(parallel, corpus: Path, tmp_path: Path, monkeypatch) -> None:
    save = tmp_path / "ck"
    real_step = Trainer.train_step

    def step_then_signal(self):
        loss = real_step(self)
        if self.iteration == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return loss

    monkeypatch.setattr(Trainer, "train_step", step_then_signal)
    result = train(tiny_config(corpus, train_iters=10, save=str(save)), parallel)
    assert result.status == "interrupted" and result.iteration == 3
    assert (save / "latest").read_text() == "global_step3"


def test_reference_checkpoint_loads_weights_and_iteration(parallel, corpus: Path, saved_run: Path, tmp_path: Path) -> None:
    """A GPT-NeoX-flavoured checkpoint (no kerple metadata, model-parallel 2) resumes weights and iteration
    through kerple.checkpoint; the optimizer starts fresh."""
    from kerple.checkpoint import read_checkpoint, write_checkpoint

    source = read_checkpoint(saved_run)
    reference = tmp_path / "neox"
    write_checkpoint(reference, source.state_dict, iteration=4, args=dict(source.args), model_parallel_size=2,
                     flavor="neox", config_files={"model.yml": "pos-emb: kerple_log\n"})
    assert "kerple_checkpoint_format" not in ckpt.safe_torch_load(reference / "global_step4" / "mp_rank_00_model_states.pt")
    cfg = tiny_config(corpus, load=str(reference), train_iters=5).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    try:
        assert trainer.iteration == 4 and trainer.consumed_train_samples == 16
        assert trainer.scheduler.num_steps == 4
        assert not trainer.engine.optimizer.state_dict()["state"]  # reference format: fresh optimizer
        weights = NeoxAdapter.for_model(trainer.model).to_reference(trainer.model.state_dict())
        for name, tensor in source.state_dict.items():
            assert torch.equal(weights[name], tensor), name
    finally:
        trainer.close()
    wrong = tiny_config(corpus, load=str(reference), pos_emb="alibi").resolve_batch(1)
    with pytest.raises(ckpt.ArchitectureMismatchError, match="pos_emb"):
        Trainer(wrong, parallel)
