"""Two CPU processes (gloo), pipe_parallel_size 2: a 2-stage KERPLE run trains like one process.

The one-process reference run happens in the test process, before the workers start, with the same
seed, data and LR schedule. The workers train the pipeline, save, check that the shared KERPLE
parameters hold one set of values on both stages, record the last stage's logits for a fixed
batch, and resume from their checkpoint for two more steps (with activation checkpointing on).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parents[1] / "unit" / "training"
sys.path.insert(0, str(HERE))

from kerple.model import build_model  # noqa: E402
from kerple import checkpoint as ckpt  # noqa: E402
from tiny_run import run_two_ranks, single_process_group, tiny_config, train, write_corpus  # noqa: E402

STEPS = 10
RESUMED_STEPS = 2
TOTAL = STEPS + RESUMED_STEPS
BATCH = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}  # 2 micro-batches in flight

WORKER = textwrap.dedent(
    """
    import gc, json, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, {here!r})
    from kerple.parallel.groups import init_distributed, teardown
    from kerple.training.trainer import Trainer
    from tiny_run import tiny_config
    corpus, out, logits_file, save, batch = {corpus!r}, {out!r}, {logits_file!r}, {save!r}, {batch!r}
    parallel = init_distributed(1, 2)
    stage = parallel.pipe_parallel_rank

    cfg = tiny_config(corpus, pipe_parallel_size=2, train_iters={steps}, lr_decay_iters={total}, save=save, **batch)
    trainer = Trainer(cfg.resolve_batch(2), parallel)
    initial = {{name: param.detach().clone() for name, param in trainer.model.positional.named_parameters()}}
    result = trainer.train()
    report = {{"losses": [loss for _, loss in result.losses], "indices": trainer.model.local_indices}}
    positional = {{name: param.detach().clone() for name, param in trainer.model.positional.named_parameters()}}
    stages = [None, None]
    dist.all_gather_object(stages, positional)
    report["positional_names"] = sorted(positional)
    report["positional_gap"] = max((stages[0][name] - stages[1][name]).abs().max().item() for name in positional)
    report["positional_moved"] = min((positional[name] - initial[name]).abs().max().item() for name in positional)

    # the pipeline's output for a fixed batch: stage 0 sends its hidden states to stage 1
    tokens = torch.randint(0, 63, (2, 16), generator=torch.Generator().manual_seed(3))
    trainer.model.eval()
    with torch.no_grad():
        if stage == 0:
            dist.send(trainer.model(tokens).contiguous(), dst=1)
        else:
            hidden = torch.empty(2, 16, 32)
            dist.recv(hidden, src=0)
            torch.save({{"tokens": tokens, "logits": trainer.model(hidden)}}, logits_file)
    trainer.close()
    del trainer
    gc.collect()

    # resume the pipeline run (same pipe size): weights, optimizer, schedule and iteration; with
    # activation checkpointing on, which must not change the numbers
    cfg = tiny_config(
        corpus, pipe_parallel_size=2, train_iters={total}, lr_decay_iters={total}, save=save, load=save,
        checkpoint_activations=True, **batch
    )
    trainer = Trainer(cfg.resolve_batch(2), parallel)
    report["resumed_at"] = trainer.iteration
    result = trainer.train()
    report["resumed_losses"] = [loss for _, loss in result.losses]
    report["resumed_eval"] = [loss for _, loss in result.eval_losses]
    trainer.close()
    del trainer
    if stage == 1:
        with open(out, "w") as handle:
            json.dump(report, handle)
    gc.collect()
    teardown(parallel)
    """
)


@pytest.fixture(scope="module")
def parallel():
    yield from single_process_group()


@pytest.mark.slow
def test_two_stage_pipeline_trains_like_one_process(parallel, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "data" / "corpus")
    save, out, logits_file = tmp_path / "pipe", tmp_path / "report.json", tmp_path / "logits.pt"
    reference = train(tiny_config(corpus, train_iters=TOTAL, lr_decay_iters=TOTAL, **BATCH), parallel)
    reference_losses = [loss for _, loss in reference.losses]

    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(here=str(HERE), corpus=str(corpus), out=str(out), logits_file=str(logits_file),
                                    save=str(save), batch=BATCH, steps=STEPS, total=TOTAL))
    run_two_ranks(script, timeout=300)
    report = json.loads(out.read_text())

    # stage 1 holds the second transformer layer, the final norm and the head (indices 3, 5, 6)
    assert report["indices"] == [3, 5, 6]
    # same seed, batch and weights: the first loss is the one-process model's, then both train alike
    losses = report["losses"]
    assert len(losses) == STEPS
    assert losses[0] == pytest.approx(reference_losses[0], rel=1e-6, abs=1e-6)
    assert losses == pytest.approx(reference_losses[:STEPS], rel=1e-5, abs=1e-5)
    assert losses[-1] < losses[0] - 0.3

    # the shared KERPLE parameters are one set of values on both stages, and they did train
    assert report["positional_names"] == ["bias_a", "bias_p"]
    assert report["positional_gap"] == 0.0
    assert report["positional_moved"] > 0.0

    # reference layout: each stage wrote its own layer files, together the one-process set
    step = save / f"global_step{STEPS}"
    assert sorted(p.name for p in step.glob("layer_*")) == [
        f"layer_{index:02d}-model_00-model_states.pt" for index in (0, 2, 3, 5, 6)
    ]
    assert (step / "mp_rank_00_model_states.pt").is_file() and (step / "pipe_01-mp_rank_00_model_states.pt").is_file()
    assert ckpt.safe_torch_load(step / "mp_rank_00_model_states.pt")["pipe_world_size"] == 2
    stage0 = ckpt.safe_torch_load(step / "layer_02-model_00-model_states.pt")
    stage1 = ckpt.safe_torch_load(step / "layer_03-model_00-model_states.pt")
    assert torch.equal(stage0["attention.rpe.bias_p"], stage1["attention.rpe.bias_p"])
    assert torch.equal(stage0["attention.rpe.bias_a"], stage1["attention.rpe.bias_a"])

    # the checkpoint loads into a one-process model and gives the pipeline's logits
    single = build_model(tiny_config(corpus)).eval()
    assert ckpt.load_model_weights(single, step) == STEPS
    saved = torch.load(logits_file)
    with torch.no_grad():
        torch.testing.assert_close(single(saved["tokens"]), saved["logits"], rtol=1e-5, atol=1e-5)

    # resume with the same pipe size: iteration, weights, optimizer and schedule continue the run
    assert report["resumed_at"] == STEPS
    assert report["resumed_losses"] == pytest.approx(reference_losses[STEPS:], rel=1e-5, abs=1e-5)
    # validation through the pipeline engine gives the one-process value
    assert report["resumed_eval"] == pytest.approx([loss for _, loss in reference.eval_losses], rel=1e-5, abs=1e-5)
