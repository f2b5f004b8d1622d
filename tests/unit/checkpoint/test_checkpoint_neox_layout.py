"""The state-dict adapter against the layout of docs/reference-format.md §6, and the run-state record."""

from __future__ import annotations

import pytest
import torch

from kerple import positional
from kerple.checkpoint import CheckpointError, ModelParallelError, NeoxAdapter, RunState
from kerple.checkpoint.run_state import ParallelSizes

from ckpt_helpers import tiny_model


@pytest.mark.parametrize("untied", [True, False])
@pytest.mark.parametrize("name", positional.names())
def test_round_trip_keeps_every_tensor(name: str, untied: bool) -> None:
    model = tiny_model(name, no_weight_tying=untied)
    state = model.state_dict()
    adapter = NeoxAdapter.for_model(model)
    back = adapter.from_reference(adapter.to_reference(state))
    assert set(back) == set(state)
    assert all(back[key] is state[key] for key in state)


def test_stage_part_gets_copies_only_in_its_own_layers() -> None:
    """A pipeline stage holding layer 1, the final norm and the head of a 2-layer KERPLE model."""
    adapter = NeoxAdapter(num_layers=2, positional_module="rpe")
    part = {
        "layers.1.attention.dense.weight": torch.zeros(1),
        "layers.1.mlp.dense_4h_to_h.bias": torch.zeros(1),
        "positional.bias_p": torch.ones(1),
        "final_norm.weight": torch.ones(1),
        "lm_head.weight": torch.zeros(1),
    }
    assert list(adapter.to_reference(part)) == [  # the module sits right after the attention keys
        "sequential.3.attention.dense.weight",
        "sequential.3.attention.rpe.bias_p",
        "sequential.3.mlp.dense_4h_to_h.bias",
        "sequential.5.norm.weight",
        "sequential.6.final_linear.weight",
    ]
    assert adapter.slots() == ["embedding", None, "layers.0", "layers.1", None, "final_norm", "lm_head"]


def test_input_embedding_is_stored_beside_the_word_embeddings() -> None:
    adapter = NeoxAdapter(num_layers=1, positional_at_input=True)
    state = {"embedding.word_embeddings.weight": torch.zeros(1), "positional.position_embeddings.weight": torch.ones(1)}
    assert list(adapter.to_reference(state)) == [
        "sequential.0.word_embeddings.weight",
        "sequential.0.position_embeddings.weight",
    ]


def test_reading_checks_copies_and_drops_the_tied_heads_embedding_copy() -> None:
    adapter = NeoxAdapter(num_layers=2)
    state = {
        "sequential.0.word_embeddings.weight": torch.zeros(2),
        "sequential.2.attention.alibi_embed.slopes": torch.ones(2),
        "sequential.3.attention.alibi_embed.slopes": torch.ones(2),
        "sequential.6.word_embeddings.weight": torch.zeros(2),  # a tied head's stage in the reference
    }
    assert set(adapter.from_reference(state)) == {"embedding.word_embeddings.weight", "positional.slopes"}
    state["sequential.3.attention.alibi_embed.slopes"] = torch.full((2,), 2.0)
    with pytest.raises(ModelParallelError, match=r"alibi_embed\.slopes.*layer 2 and layer\(s\) \[3\]"):
        adapter.from_reference(state)


def test_a_key_without_a_place_is_named() -> None:
    with pytest.raises(CheckpointError, match="'rotary_cache.table'"):
        NeoxAdapter(num_layers=1).to_reference({"rotary_cache.table": torch.zeros(1)})


def test_optimizer_order_is_the_checkpoint_order() -> None:
    model = tiny_model("kerple_log")
    names = [name for name, _ in NeoxAdapter.for_model(model).parameter_order(model)]
    dense = names.index("layers.0.attention.dense.bias")
    assert names[0] == "embedding.word_embeddings.weight"
    assert names[dense + 1 : dense + 3] == ["positional.bias_p", "positional.bias_a"]  # first layer's copy
    assert names[-3:] == ["final_norm.weight", "final_norm.bias", "lm_head.weight"]
    assert sorted(names) == sorted(name for name, _ in model.named_parameters())  # each parameter once


def test_adapter_read_from_checkpoint_keys_matches_the_model() -> None:
    for name in ("kerple_log", "rpe", "alibi", "rotary", "learned"):
        model = tiny_model(name)
        adapter = NeoxAdapter.for_model(model)
        assert NeoxAdapter.for_reference(adapter.to_reference(model.state_dict())) == adapter
        assert NeoxAdapter.for_embedding(2, name) == adapter


def test_run_state_record_round_trip() -> None:
    state = RunState(
        iteration=7, args={"num_layers": 2}, consumed_train_samples=56, skipped_steps=1, seed=3,
        lr_scheduler={"num_iters": 7}, rng={"torch_rng_state": torch.get_rng_state()},
        optimizer={"state": {}}, sizes=ParallelSizes(model=2, data=1, pipe=1), ds_version="0.19.8",
    )
    record = state.to_record()
    assert record["data_position"] == {"consumed_train_samples": 56, "seed": 3}
    assert (record["global_steps"], record["global_samples"], record["module"]) == (7, 56, None)
    again = RunState.from_record(record)
    assert torch.equal(again.rng.pop("torch_rng_state"), state.rng.pop("torch_rng_state"))
    assert again == state
    assert again.optimizer_resumable(2, 1) and not again.optimizer_resumable(1, 1)
    reference = RunState.from_record({"iteration": 50, "args": {}, "optimizer": {"state": {}}})
    assert not reference.is_own_format and not reference.optimizer_resumable(1, 1)
