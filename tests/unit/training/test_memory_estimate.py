"""A run whose micro-batch cannot fit the memory is refused before it starts, naming the keys (the
kernel used to kill it at the first step, with no word). The bound is checked against a hand count."""

from __future__ import annotations

import pytest

from kerple.training import memory
from kerple.training.trainer import Trainer, TrainingError
from tiny_run import corpus, parallel, tiny_config  # noqa: F401 (fixtures)


def test_the_bound_is_the_hand_counted_one(corpus) -> None:  # noqa: F811
    """tiny_config: 2 layers, hidden 32, 4 heads, seq 32, vocab 64, fp32, eager, micro-batch 4."""
    cfg = tiny_config(corpus)
    estimate = memory.training_memory(cfg, parameters=1000)
    # weights, gradients, Adam's two moments; the fused loss's one chunk: all 4 x 32 positions' fp32 logits
    assert estimate.states == 1000 * (4 + 4 + 8) + 4 * 32 * 64 * 4
    per_layer = 8 * 32 * 32 * 4 + 4 * 32 * 32 * 4  # 8 hidden-sized tensors per token, the eager softmax
    assert estimate.activations_per_sample == 2 * per_layer
    assert estimate.logits_per_sample == 0  # no [b, s, V] output is held
    assert estimate.total == estimate.states + 4 * (estimate.activations_per_sample + estimate.logits_per_sample)
    recomputed = memory.training_memory(tiny_config(corpus, checkpoint_activations=True), parameters=1000)
    assert recomputed.activations_per_sample == 2 * 32 * 32 * 4 + per_layer  # layer inputs, one layer again
    sliced = tiny_config(corpus)
    sliced.parallelism.model_parallel_size = 2  # the vocab-parallel loss reads the rank's whole logits
    split = memory.training_memory(sliced, parameters=1000)
    assert split.logits_per_sample == 32 * 64 * (4 + 4) / 2  # logits and the fp32 log-softmax, half the vocabulary
    assert split.states == 1000 / 2 * (4 + 4 + 8)


def test_a_batch_that_cannot_fit_is_refused_before_anything_is_built(parallel, corpus, monkeypatch) -> None:  # noqa: F811
    cfg = tiny_config(corpus, train_micro_batch_size_per_gpu=64).resolve_batch(1)
    estimate = memory.training_memory(cfg, memory.parameter_count(cfg))
    room = estimate.states + 10 * (estimate.activations_per_sample + estimate.logits_per_sample)
    monkeypatch.setattr(memory, "available_memory", lambda device, processes: (room, "of available RAM"))
    with pytest.raises(TrainingError) as refused:
        Trainer(cfg, parallel)
    message = str(refused.value)
    assert "micro_batch_size 64 x seq_length 32 needs at least" in message and "\n" not in message
    assert "micro_batch_size well under 11" in message and "gradient_accumulation_steps keeps the batch" in message


def test_model_states_that_cannot_fit_name_the_model_keys(parallel, corpus, monkeypatch) -> None:  # noqa: F811
    cfg = tiny_config(corpus).resolve_batch(1)
    monkeypatch.setattr(memory, "available_memory", lambda device, processes: (1000, "of available RAM"))
    with pytest.raises(TrainingError, match="a smaller hidden_size or num_layers .*zero_stage"):
        Trainer(cfg, parallel)
