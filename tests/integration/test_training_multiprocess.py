"""Two CPU processes (gloo): data-parallel ZeRO 1 and 2 match one process with the same global batch,
and a sharded-optimizer checkpoint resumes exactly on two ranks."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "unit" / "training"
sys.path.insert(0, str(HERE))

from tiny_run import run_two_ranks, single_process_group, tiny_config, train, write_corpus  # noqa: E402

WORKER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {here!r})
    from kerple.parallel.groups import init_distributed, teardown
    from tiny_run import tiny_config, train
    corpus, out, save = {corpus!r}, {out!r}, {save!r}
    parallel = init_distributed(1, 1)
    results = {{}}
    for stage in (1, 2):
        cfg = tiny_config(corpus, train_iters=6, lr_decay_iters=6, gradient_accumulation_steps=1,
                          zero_optimization={{"stage": stage}})
        results[f"zero{{stage}}"] = [loss for _, loss in train(cfg, parallel).losses]
    # sharded optimizer state: 3 steps + save + resume 3 steps == 6 steps
    first = train(tiny_config(corpus, train_iters=3, lr_decay_iters=6, gradient_accumulation_steps=1,
                              zero_optimization={{"stage": 1}}, save=save), parallel)
    second = train(tiny_config(corpus, train_iters=6, lr_decay_iters=6, gradient_accumulation_steps=1,
                               zero_optimization={{"stage": 1}}, save=save, load=save), parallel)
    results["zero1_resumed"] = [loss for _, loss in first.losses + second.losses]
    if parallel.rank == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)
    teardown(parallel)
    """
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "corpus")


@pytest.mark.slow
def test_two_process_zero_matches_one_process(corpus: Path, tmp_path: Path) -> None:
    out, save = tmp_path / "losses.json", tmp_path / "ck"
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(here=str(HERE), corpus=str(corpus), out=str(out), save=str(save)))
    run_two_ranks(script, timeout=400)
    two = json.loads(out.read_text())

    # one process, same global batch of 8: micro 4 x accumulation 2
    gen = single_process_group()
    parallel = next(gen)
    try:
        one = [loss for _, loss in train(tiny_config(corpus, train_iters=6, lr_decay_iters=6,
                                                      gradient_accumulation_steps=2), parallel).losses]
    finally:
        gen.close()
    for stage in ("zero1", "zero2"):
        assert two[stage] == pytest.approx(one, rel=1e-5, abs=1e-6), stage
    assert two["zero1_resumed"] == two["zero1"]
    assert (save / "global_step6" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()


ZERO3_WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    sys.path.insert(0, {here!r})
    from kerple.parallel.groups import init_distributed, teardown
    from kerple.training.engine import gathered
    from kerple.training.trainer import Trainer
    from tiny_run import tiny_config, train
    corpus, out, save, resume = {corpus!r}, {out!r}, {save!r}, {resume!r}
    zero3 = {{"stage": 3, "stage3_param_persistence_threshold": 0}}  # partition even the tiny tensors
    parallel = init_distributed(1, 1)
    results = {{}}
    cfg = tiny_config(corpus, train_iters=6, lr_decay_iters=6, zero_optimization=zero3, save=save)
    cfg.resolve_batch(parallel.world_size)
    trainer = Trainer(cfg, parallel)
    try:
        results["zero3"] = [loss for _, loss in trainer.train().losses]
        with gathered(list(trainer.model.parameters()), zero3=True):  # the final weights, whole
            final = {{k: v.detach().clone() for k, v in trainer.model.state_dict().items()}}
    finally:
        trainer.close()
    # 3 steps + save + resume 3 steps == 6 steps
    first = train(tiny_config(corpus, train_iters=3, lr_decay_iters=6, zero_optimization=zero3, save=resume), parallel)
    second = train(tiny_config(corpus, train_iters=6, lr_decay_iters=6, zero_optimization=zero3, save=resume,
                               load=resume, checkpoint_activations=True), parallel)  # recompute: same numbers
    results["zero3_resumed"] = [loss for _, loss in first.losses + second.losses]
    if parallel.rank == 0:
        torch.save(final, out + ".final.pt")
        with open(out, "w") as handle:
            json.dump(results, handle)
    teardown(parallel)
    """
)


@pytest.mark.slow
def test_two_process_zero3_matches_one_process_and_saves_full_weights(corpus: Path, tmp_path: Path) -> None:
    import torch

    from kerple.model import build_model
    from kerple.checkpoint import load_model_weights

    out, save, resume = tmp_path / "losses.json", tmp_path / "ck", tmp_path / "resume"
    script = tmp_path / "worker.py"
    script.write_text(ZERO3_WORKER.format(here=str(HERE), corpus=str(corpus), out=str(out), save=str(save),
                                          resume=str(resume)))
    run_two_ranks(script, timeout=400)
    two = json.loads(out.read_text())

    gen = single_process_group()
    parallel = next(gen)
    try:
        one = [loss for _, loss in train(tiny_config(corpus, train_iters=6, lr_decay_iters=6,
                                                      gradient_accumulation_steps=2), parallel).losses]
    finally:
        gen.close()
    assert two["zero3"] == pytest.approx(one, rel=1e-5, abs=1e-6)
    assert two["zero3_resumed"] == two["zero3"]
    step = save / "global_step6"
    assert (step / "zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()

    # the layer files hold the full parameters: a plain one-process model loads them and gives the
    # logits of the trainer's final (gathered) weights
    cfg = tiny_config(corpus)
    final = torch.load(str(out) + ".final.pt")
    gathered, loaded = build_model(cfg).eval(), build_model(cfg).eval()
    gathered.load_state_dict(final)
    assert load_model_weights(loaded, save) == 6
    for key, value in loaded.state_dict().items():
        assert value.shape == final[key].shape and value.numel() > 0, key
    tokens = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), gathered(tokens), rtol=0, atol=0)
