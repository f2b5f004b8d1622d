"""FIRE, CABLE, xPos and Sandwich end to end on CPU: each trains a few steps of configs/models/tiny.yml
through eager and through sdpa, then evaluates at 4x the train length through eager, sdpa and
FlexAttention (uncompiled, and compiled with ``aot_eager`` as a GPU would compile it), all agreeing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "training"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "model"))

from compiled_flex import compiled_cpu_flex  # noqa: E402
from kerple.training.trainer import Trainer  # noqa: E402
from tiny_run import VOCAB, corpus, parallel, tiny_config  # noqa: E402

TRAIN_LENGTH, STEPS = 32, 12
LATER = ["fire", "cable", "xpos", "sandwich"]


def counting_tokens(length: int) -> torch.Tensor:
    """Two documents of the training corpus's kind (counting upwards modulo 63), each ``length + 1`` long."""
    rows = [(start + step * torch.arange(length + 1)) % (VOCAB - 1) for start, step in ((5, 1), (40, 2))]
    return torch.stack(rows)


def loss_at(model: torch.nn.Module, impl: str, tokens: torch.Tensor) -> float:
    model.set_attention(impl)
    with torch.no_grad():
        logits = model(tokens[:, :-1])[..., :VOCAB]
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()).item()


@pytest.mark.parametrize(("name", "train_impl"), [
    # FIRE compiled through flex: 12 s
    pytest.param(name, impl, marks=[pytest.mark.slow] if (name, impl) == ("fire", "eager") else [])
    for name in LATER for impl in ("eager", "sdpa")
])
def test_trains_and_evaluates_at_four_times_the_train_length(
    name: str, train_impl: str, parallel, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = {"fire": {"fire_init_threshold": 8.0}}.get(name, {})  # FIRE's ψ(i) normaliser acts from position 8
    cfg = tiny_config(corpus, pos_emb=name, attention_impl=train_impl, seq_length=TRAIN_LENGTH, train_iters=STEPS,
                      lr_decay_iters=STEPS, **overrides).resolve_batch(1)
    trainer = Trainer(cfg, parallel)
    initial = {key: value.detach().clone() for key, value in trainer.model.positional.named_parameters()}
    try:
        result = trainer.train()
    finally:
        trainer.close()
    model = trainer.model.eval()
    assert model.attention_impl == train_impl and type(model.positional).__name__ == {
        "fire": "Fire", "cable": "Cable", "xpos": "XposEmbedding", "sandwich": "Sandwich"}[name]
    losses = [loss for _, loss in result.losses]
    assert len(losses) == STEPS and all(math.isfinite(loss) for loss in losses)
    for key, value in model.positional.named_parameters():  # the learnable terms were trained
        assert not torch.equal(value.detach(), initial[key]), key

    tokens = counting_tokens(4 * TRAIN_LENGTH)
    cfg.check_eval_length(4 * TRAIN_LENGTH)
    eager = loss_at(model, "eager", tokens)
    assert math.isfinite(eager) and eager < math.log(VOCAB)  # learned something that holds at 4x
    assert loss_at(model, "sdpa", tokens) == pytest.approx(eager, rel=1e-5)
    assert loss_at(model, "flex", tokens) == pytest.approx(eager, rel=1e-5)
    if train_impl == "eager":  # one compiled check per embedding
        with compiled_cpu_flex(monkeypatch, model._flex) as counter:
            compiled = loss_at(model, "flex", tokens)
        assert counter.frame_count >= 1, "FlexAttention ran compiled"
        assert compiled == pytest.approx(eager, rel=1e-5)
