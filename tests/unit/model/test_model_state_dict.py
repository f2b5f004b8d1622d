"""The model's own state-dict names, and the reference's sequential names its adapter gives
(docs/reference-format.md §6)."""

from __future__ import annotations

import pytest
import torch

from kerple import positional
from kerple.checkpoint import NeoxAdapter
from model_helpers import VOCAB, tiny_model

LAYER_KEYS = [
    f"{module}.{tensor}"
    for module in (
        "input_layernorm",
        "attention.query_key_value",
        "attention.dense",
        "post_attention_layernorm",
        "mlp.dense_h_to_4h",
        "mlp.dense_4h_to_h",
    )
    for tensor in ("weight", "bias")
]


def _expected_keys(model, extra_layer: list[str], extra_embedding: list[str]) -> set[str]:
    keys = {"sequential.0.word_embeddings.weight", *(f"sequential.0.{key}" for key in extra_embedding)}
    for index in (2, 3):
        keys |= {f"sequential.{index}.{key}" for key in LAYER_KEYS + extra_layer}
    keys |= {"sequential.5.norm.weight", "sequential.5.norm.bias", "sequential.6.final_linear.weight"}
    return keys


@pytest.mark.parametrize(
    "name,extra_layer,extra_embedding",
    [
        ("none", [], []),
        ("learned", [], ["position_embeddings.weight"]),
        ("sinusoidal", [], []),
        ("rotary", ["attention.rotary_emb.inv_freq"], []),
        ("alibi", ["attention.alibi_embed.slopes"], []),
        ("rpe", ["attention.rpe.weight"], []),
        ("kerple_log", ["attention.rpe.bias_p", "attention.rpe.bias_a"], []),
        ("kerple_bias_wht", ["attention.rpe.bias_p", "attention.rpe.bias_a", "attention.rpe.wei_p", "attention.rpe.wei_a"], []),
    ],
)
def test_reference_key_names(name: str, extra_layer: list[str], extra_embedding: list[str]) -> None:
    model = tiny_model(name)
    reference = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    assert set(reference) == _expected_keys(model, extra_layer, extra_embedding)


def test_model_names_are_its_own_structure() -> None:
    model = tiny_model("kerple_log")
    layer = {f"layers.{i}.{key}" for i in (0, 1) for key in LAYER_KEYS}
    assert set(model.state_dict()) == {
        "embedding.word_embeddings.weight", "positional.bias_p", "positional.bias_a", *layer,
        "final_norm.weight", "final_norm.bias", "lm_head.weight",
    }
    # the positional module is registered once, as the model's own submodule
    assert [name for name, module in model.named_modules() if module is model.positional] == ["positional"]


def test_shapes_of_reference_tensors() -> None:
    model = tiny_model("kerple_log")
    state = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    assert state["sequential.0.word_embeddings.weight"].shape == (VOCAB, 32)
    assert state["sequential.2.attention.query_key_value.weight"].shape == (96, 32)
    assert state["sequential.2.mlp.dense_h_to_4h.weight"].shape == (128, 32)
    assert state["sequential.6.final_linear.weight"].shape == (VOCAB, 32)
    assert state["sequential.3.attention.rpe.bias_p"].shape == (4, 1, 1)


@pytest.mark.parametrize("name", positional.names())
def test_positional_tensors_are_shared_by_every_layer(name: str) -> None:
    """Every layer's keys under ``attention.<state_dict_name>`` are the embedding's own tensors."""
    model = tiny_model(name)
    state = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    own = model.positional.state_dict()
    if model.positional.kind.value == "input":
        return
    prefix = model.positional.state_dict_name or "positional"
    for key, tensor in own.items():
        copies = [state[f"sequential.{index}.attention.{prefix}.{key}"] for index in (2, 3)]
        assert {copy.data_ptr() for copy in copies} == {tensor.data_ptr()}
    model_params = {id(p) for p in model.parameters()}
    own_params = [id(p) for p in model.positional.parameters()]
    assert all(param in model_params for param in own_params)
    assert len(list(model.parameters())) == len(model_params)  # each shared parameter yielded once


def test_tied_head_has_no_final_linear() -> None:
    model = tiny_model("none", no_weight_tying=False)
    assert model.lm_head is None
    assert not any(key.startswith("sequential.6.") for key in NeoxAdapter.for_model(model).to_reference(model.state_dict()))
    assert model.lm_head_weight is model.embedding.word_embeddings.weight


def test_load_state_dict_round_trip_writes_the_shared_tensor() -> None:
    source = tiny_model("kerple_log", seed=1)
    target = tiny_model("kerple_log", seed=2)
    tokens = torch.randint(0, VOCAB, (1, 16))
    assert not torch.allclose(source(tokens), target(tokens))
    bias_p = target.positional.bias_p
    adapter = NeoxAdapter.for_model(source)
    target.load_state_dict(adapter.from_reference(adapter.to_reference(source.state_dict())))
    torch.testing.assert_close(target(tokens), source(tokens), rtol=0, atol=0)
    assert target.positional.bias_p is bias_p  # the one parameter, written in place
    torch.testing.assert_close(bias_p, source.positional.bias_p, rtol=0, atol=0)


def test_learned_table_is_stored_with_the_embedding() -> None:
    model = tiny_model("learned")
    weight = NeoxAdapter.for_model(model).to_reference(model.state_dict())["sequential.0.position_embeddings.weight"]
    assert weight.data_ptr() == model.positional.position_embeddings.weight.data_ptr()
    assert sum(1 for name, _ in model.named_parameters() if "position_embeddings" in name) == 1


def test_bf16_cast_keeps_kerple_parameters_fp32() -> None:
    model = tiny_model("kerple_log").to(torch.bfloat16)
    assert model.layers[0].attention.query_key_value.weight.dtype == torch.bfloat16
    assert model.positional.bias_p.dtype == torch.float32
    logits = model(torch.randint(0, VOCAB, (1, 12)))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
