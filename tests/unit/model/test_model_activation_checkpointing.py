"""Activation checkpointing: recomputing layers in backward leaves loss and gradients unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kerple.config import load_config
from kerple.model import build_model
from model_helpers import VOCAB, tiny_model


def _loss_and_grads(model: torch.nn.Module, tokens: torch.Tensor, seed: int = 7) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks in both runs
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


@pytest.mark.parametrize("name", ["kerple_log", "rpe"])
@pytest.mark.parametrize("group", [1, 2, 3])  # 2 layers: 3 is one group of both
def test_checkpointing_keeps_loss_and_gradients(name: str, group: int) -> None:
    model = tiny_model(name, hidden_dropout=0.1, attention_dropout=0.1).train()
    tokens = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    plain_loss, plain_grads = _loss_and_grads(model, tokens)
    model.checkpoint_activations, model.checkpoint_num_layers = True, group
    ckpt_loss, ckpt_grads = _loss_and_grads(model, tokens)
    assert ckpt_loss == pytest.approx(plain_loss, rel=1e-6)
    assert plain_grads.keys() == ckpt_grads.keys()
    shared = [n for n, _ in model.positional.named_parameters()]
    assert shared, "the embedding under test has learnable shared parameters"
    for key, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[key], grad, rtol=1e-6, atol=1e-7, msg=key)


def test_checkpointing_is_really_used(monkeypatch: pytest.MonkeyPatch) -> None:
    import kerple.model.gpt as gpt

    calls = []
    original = gpt.checkpoint
    monkeypatch.setattr(gpt, "checkpoint", lambda *a, **k: calls.append(k) or original(*a, **k))
    model = tiny_model("kerple_log").train()
    model.checkpoint_activations, model.checkpoint_num_layers = True, 1
    tokens = torch.randint(0, VOCAB, (1, 8))
    model(tokens).sum().backward()
    assert len(calls) == 2 and all(k.get("use_reentrant") is False for k in calls)
    calls.clear()
    with torch.no_grad():
        model(tokens)  # no autograd: nothing to recompute
    model.eval()
    model(tokens)  # evaluation forwards run the layers directly
    assert calls == []


def test_config_keys_reach_the_model() -> None:
    base = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 60,
            "train_iters": 0}
    model = build_model(load_config([], base))
    assert (model.checkpoint_activations, model.checkpoint_num_layers) == (False, 1)
    model = build_model(load_config([], {**base, "checkpoint_activations": True, "checkpoint_num_layers": 2}))
    assert (model.checkpoint_activations, model.checkpoint_num_layers) == (True, 2)
