"""Two CPU processes (gloo), model_parallel_size 2: logits, loss and gradients match the whole model;
a TP=2 training run matches TP=1 step by step; checkpoints convert between TP=1 and TP=2.

The whole-model reference is computed in the same processes from the same seed (single-process
math); the TP=1 training run happens in the test process, before the workers start.
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

EMBEDDINGS = ("kerple_log", "alibi", "rpe", "rotary")
STEPS = 4

WORKER = textwrap.dedent(
    """
    import gc, json, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, {here!r})
    from kerple.checkpoint import NeoxAdapter, ShardSpec, merge_model_parallel
    from kerple.model import build_model
    from kerple.parallel.groups import init_distributed, teardown
    from kerple.parallel.tensor_parallel import parallelize, vocab_parallel_loss
    from kerple.training.loss import cross_entropy
    from kerple.training.trainer import Trainer
    from tiny_run import gather_vocab_parallel, tiny_config, train
    corpus, out, save_tp1, save_tp2 = {corpus!r}, {out!r}, {save_tp1!r}, {save_tp2!r}
    parallel = init_distributed(2, 1)
    report = {{"equivalence": {{}}}}

    def gathered_grads(model):
        adapter = NeoxAdapter.for_model(model)  # the merge reads the checkpoint's names
        local = adapter.to_reference({{name: param.grad for name, param in model.named_parameters()}})
        ranks = [None, None]
        dist.all_gather_object(ranks, local, group=parallel.model_parallel_group)
        return adapter.from_reference(merge_model_parallel(ranks, ShardSpec(4, 32)))

    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 63, (2, 16), generator=generator)
    labels = torch.randint(0, 63, (2, 16), generator=generator)
    labels[0, :3] = -100
    for pos_emb in {embeddings!r}:
        cfg = tiny_config(corpus, pos_emb=pos_emb, model_parallel_size=2)
        torch.manual_seed(7)
        whole = build_model(cfg)
        torch.manual_seed(7)
        part = parallelize(build_model(cfg), cfg, parallel)
        whole_logits = whole(tokens)
        whole_loss = cross_entropy(whole_logits, labels)
        whole_loss.backward()
        part_logits = part(tokens)  # [b, s, V/2]
        part_loss = vocab_parallel_loss(part_logits, labels)
        part_loss.backward()
        full_grads = {{name: param.grad for name, param in whole.named_parameters()}}
        grads = gathered_grads(part)
        report["equivalence"][pos_emb] = {{
            "local_vocab": part_logits.shape[-1],
            "logits": (gather_vocab_parallel(part_logits.detach(), parallel) - whole_logits).abs().max().item(),
            "loss": abs(part_loss.item() - whole_loss.item()),
            "grad": max((grads[name] - full_grads[name]).abs().max().item() for name in full_grads),
            "grad_names_equal": sorted(grads) == sorted(full_grads),
        }}

    cfg = tiny_config(corpus, model_parallel_size=2, train_iters={steps}, lr_decay_iters={steps}, save=save_tp2)
    report["tp2_losses"] = [loss for _, loss in train(cfg, parallel).losses]

    # a TP=1 checkpoint resumed by a TP=2 trainer: same logits as the whole model loaded from it
    cfg = tiny_config(corpus, model_parallel_size=2, train_iters={steps} + 1, lr_decay_iters={steps}, load=save_tp1)
    trainer = Trainer(cfg.resolve_batch(2), parallel)
    whole = build_model(tiny_config(corpus))
    from kerple.checkpoint import load_model_weights
    load_model_weights(whole, save_tp1)
    with torch.no_grad():
        logits = gather_vocab_parallel(trainer.model(tokens), parallel)
        report["tp1_into_tp2"] = {{"iteration": trainer.iteration, "logits": (logits - whole(tokens)).abs().max().item()}}
    trainer.close()
    del trainer
    if parallel.rank == 0:
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
def test_tensor_parallel_matches_single_process(parallel, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "data" / "corpus")
    save_tp1, save_tp2, out = tmp_path / "tp1", tmp_path / "tp2", tmp_path / "report.json"
    tp1 = train(tiny_config(corpus, train_iters=STEPS, lr_decay_iters=STEPS, save=str(save_tp1)), parallel)

    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(here=str(HERE), corpus=str(corpus), out=str(out), save_tp1=str(save_tp1),
                                    save_tp2=str(save_tp2), embeddings=EMBEDDINGS, steps=STEPS))
    run_two_ranks(script, timeout=400)
    report = json.loads(out.read_text())

    for pos_emb in EMBEDDINGS:
        result = report["equivalence"][pos_emb]
        assert result["local_vocab"] == 32, pos_emb  # the head really is split by vocabulary
        assert result["grad_names_equal"], pos_emb
        assert result["logits"] < 1e-5 and result["loss"] < 1e-5 and result["grad"] < 1e-5, (pos_emb, result)

    # the TP=2 run takes the same steps as the TP=1 run (same seed, same data, same initial weights)
    tp1_losses = [loss for _, loss in tp1.losses]
    assert len(report["tp2_losses"]) == STEPS
    assert report["tp2_losses"] == pytest.approx(tp1_losses, rel=1e-5, abs=1e-5)

    # TP=2 checkpoint: reference layout, one file per layer and model-parallel rank, split like the reference
    step = save_tp2 / f"global_step{STEPS}"
    names = sorted(p.name for p in step.glob("layer_*"))
    assert names == sorted(f"layer_{i:02d}-model_{r:02d}-model_states.pt" for i in (0, 2, 3, 5, 6) for r in (0, 1))
    rank1 = ckpt.safe_torch_load(step / "layer_02-model_01-model_states.pt")
    assert tuple(rank1["attention.query_key_value.weight"].shape) == (48, 32)  # rows: 2 of 4 heads
    assert tuple(rank1["attention.dense.weight"].shape) == (32, 16)  # columns
    assert tuple(rank1["attention.rpe.bias_p"].shape) == (2, 1, 1)  # local heads
    assert tuple(ckpt.safe_torch_load(step / "layer_00-model_01-model_states.pt")["word_embeddings.weight"].shape) == (32, 32)

    # TP=2 -> TP=1: merged weights equal those of the TP=1 run after the same steps
    merged, single = build_model(tiny_config(corpus)), build_model(tiny_config(corpus))
    assert ckpt.load_model_weights(merged, save_tp2) == STEPS
    ckpt.load_model_weights(single, save_tp1)
    for name, tensor in single.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)

    # TP=1 -> TP=2: a TP=2 trainer loading the TP=1 checkpoint resumes its iteration and logits
    assert report["tp1_into_tp2"]["iteration"] == STEPS
    assert report["tp1_into_tp2"]["logits"] < 1e-5
