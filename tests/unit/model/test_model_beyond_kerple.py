"""FIRE and CABLE in a whole model: eager, sdpa and flex against the hand-written GPT-NeoX forward with
each paper's term restated from the checkpoint tensors (values and gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kerple.checkpoint import NeoxAdapter
from model_helpers import HEADS, LAYERS, VOCAB, cable_reference_bias, fire_reference_bias, reference_forward, tiny_model

SEQ = 19


def reference_logits(name: str, state: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    if name == "fire":
        terms = {"bias": fire_reference_bias(state, tokens.shape[1])}
    else:
        terms = {"layer_bias": cable_reference_bias(state)}
    return reference_forward(state, tokens, num_layers=LAYERS, num_heads=HEADS, **terms)


def model_and_state(name: str, impl: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model = tiny_model(name, impl=impl)
    with torch.no_grad():  # move the parameters away from their initial values (CABLE's a starts at 0)
        for param in model.positional.parameters():
            param.add_(0.3 * torch.randn_like(param))
    state = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    return model, {key: value.detach().clone() for key, value in state.items()}


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
@pytest.mark.parametrize("name", ["fire", "cable"])
def test_forward_equals_the_hand_written_model(name: str, impl: str) -> None:
    model, state = model_and_state(name, impl)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(tokens), reference_logits(name, state, tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["fire", "cable"])
def test_positional_gradients_equal_the_hand_written_model(name: str, impl: str) -> None:
    model, state = model_and_state(name, impl)
    prefix = f"sequential.2.attention.{name}."
    for key in state:
        state[key].requires_grad_(key.startswith(prefix) and state[key].is_floating_point() and "init_L" not in key)
    tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(5))
    losses = [F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
              for logits in (model.train()(tokens[:, :-1]), reference_logits(name, state, tokens[:, :-1]))]
    for loss in losses:
        loss.backward()
    for param_name, param in model.positional.named_parameters():
        expected = state[prefix + param_name].grad
        assert param.grad.abs().sum() > 0, param_name
        torch.testing.assert_close(param.grad, expected, rtol=1e-4, atol=1e-7, msg=param_name)


@pytest.mark.parametrize("name", ["fire", "cable"])
def test_compiled_flex_on_cpu_equals_eager(name: str) -> None:
    """The fused FlexAttention kernel (compiled on CPU; forward only there) with each term in ``score_mod``."""
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(6))
    options = {"fire": {"fire_mlp_width": 3}, "cable": {}}[name]  # compilation time grows with FIRE's width
    eager = tiny_model(name, options=options).eval()
    flex = tiny_model(name, impl="flex", flex_compile=True, options=options).eval()
    with torch.no_grad():
        torch.testing.assert_close(flex(tokens), eager(tokens), rtol=1e-5, atol=1e-5)
