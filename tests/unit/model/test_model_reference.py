"""The model against independent references: Hugging Face GPTNeoX (rotary) and a hand-written forward."""

from __future__ import annotations

import pytest
import torch

from kerple.checkpoint import NeoxAdapter
from model_helpers import HEADS, HIDDEN, LAYERS, VOCAB, reference_forward, tiny_model

transformers = pytest.importorskip("transformers")


def _hf_model(rotary_pct: float, parallel_residual: bool) -> "transformers.GPTNeoXForCausalLM":
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN,
        hidden_act="gelu",
        rotary_pct=rotary_pct,
        rotary_emb_base=10000,
        max_position_embeddings=128,
        layer_norm_eps=1e-5,
        use_parallel_residual=parallel_residual,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )
    config._attn_implementation = "eager"
    return transformers.GPTNeoXForCausalLM(config).eval()


def _hf_key(key: str) -> str | None:
    """Our ``sequential.N.*`` key -> Hugging Face GPTNeoX key (None for the rotary buffer)."""
    _, index, rest = key.split(".", 2)
    index = int(index)
    if index == 0:
        return "gpt_neox.embed_in.weight"
    if index == LAYERS + 3:
        return "gpt_neox.final_layer_norm." + rest.split(".", 1)[1]
    if index == LAYERS + 4:
        return "lm_head.weight"  # "embed_out" in transformers < 5
    if rest.startswith("attention.rotary_emb"):
        return None
    return f"gpt_neox.layers.{index - 2}.{rest}"


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("rotary_pct,parallel_residual", [(0.25, False), (1.0, False), (0.5, True)])
def test_matches_huggingface_gpt_neox(rotary_pct: float, parallel_residual: bool, impl: str) -> None:
    model = tiny_model("rotary", impl=impl, gpt_j_residual=parallel_residual, options={"rotary_pct": rotary_pct}).eval()
    hf = _hf_model(rotary_pct, parallel_residual)
    hf_state = hf.state_dict()
    copied = 0
    for key, value in NeoxAdapter.for_model(model).to_reference(model.state_dict()).items():
        target = _hf_key(key)
        if target is None:
            continue
        assert hf_state[target].shape == value.shape, key
        hf_state[target] = value.clone()
        copied += 1
    hf.load_state_dict(hf_state, strict=False)
    assert copied == 1 + LAYERS * 12 + 2 + 1
    tokens = torch.randint(0, VOCAB, (2, 24))
    with torch.no_grad():
        ours = model(tokens)
        theirs = hf(tokens).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def _alibi_bias(seq: int) -> torch.Tensor:
    """ALiBi for 4 heads restated: slopes 2^(-8/4 * k), k = 1..4; bias = -slope * (i - j)."""
    slopes = torch.tensor([2.0 ** (-2.0 * k) for k in range(1, HEADS + 1)])
    distance = (torch.arange(seq)[:, None] - torch.arange(seq)[None, :]).clamp(min=0).float()
    return -slopes[:, None, None] * distance


def _kerple_log_bias(state: dict[str, torch.Tensor], seq: int) -> torch.Tensor:
    """Paper Eq. (2), logarithmic variant: -r1 * log(1 + r2 * d) with r1 = bias_p, r2 = bias_a."""
    r1 = state["sequential.2.attention.rpe.bias_p"].clamp(min=0.01).view(HEADS, 1, 1)
    r2 = state["sequential.2.attention.rpe.bias_a"].clamp(min=0.01).view(HEADS, 1, 1)
    distance = (torch.arange(seq)[:, None] - torch.arange(seq)[None, :]).clamp(min=0).float()
    return -r1 * torch.log1p(r2 * distance)


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
@pytest.mark.parametrize("name", ["none", "learned", "alibi", "kerple_log"])
@pytest.mark.parametrize("window", [None, 5])
def test_matches_hand_written_forward(name: str, impl: str, window: int | None) -> None:
    seq = 20
    model = tiny_model(name, impl=impl, window=window).eval()
    reference = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    state = {key: value.detach().clone() for key, value in reference.items()}
    bias = {"alibi": lambda: _alibi_bias(seq), "kerple_log": lambda: _kerple_log_bias(state, seq)}.get(name)
    tokens = torch.randint(0, VOCAB, (2, seq))
    with torch.no_grad():
        ours = model(tokens)
    expected = reference_forward(
        state, tokens, num_layers=LAYERS, num_heads=HEADS, bias=None if bias is None else bias(), window=window
    )
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)

