"""RegularGPT's visible padding (thesis §6.2.1, footnote 1), against inputs padded by hand.

Without padding a key before position 0 is left out, which a model cannot tell from a key holding
the same state: strings of opposite parity then give the same final logits. With it, the model must
compute exactly what it computes for the tokens preceded by real PAD tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerple import checkpoint as ckpt
from kerple.config import load_config
from kerple.model import build_model
from kerple.model.regular import RegularGPT

PAD = 4  # the spare vocabulary row that stands for the PAD token in the hand-padded inputs
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"


def random_model(padding: str, chunk: int = 2, thickness: int = 1, vocab: int = 5, seed: int = 0) -> RegularGPT:
    """A float64 RegularGPT whose every weight (scalars r and norms included) is moved off its initialisation."""
    torch.manual_seed(seed)
    model = RegularGPT(chunk_size=chunk, thickness=thickness, hidden_size=32, num_attention_heads=4,
                       padded_vocab_size=vocab, padding=padding).double().eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    return model


def hand_padded_twin(model: RegularGPT) -> RegularGPT:
    """The same weights without padding, whose word embedding ``PAD`` is the PAD embedding."""
    twin = random_model("none", model.chunk_size, len(model.layers), model.vocab_size)
    twin.load_state_dict({k: v for k, v in model.state_dict().items() if k != "pad_embedding"})
    with torch.no_grad():
        twin.embedding.word_embeddings.weight[PAD] = model.pad_embedding
    return twin


def left_pad(tokens: torch.Tensor, count: int) -> torch.Tensor:
    return torch.cat([torch.full((tokens.shape[0], count), PAD), tokens], dim=1)


@pytest.mark.parametrize("block_length", [32, 256])
def test_strings_of_opposite_parity_give_different_final_logits(block_length: int) -> None:
    """``1·B`` and ``1·1·B`` (parities differ) collide without padding and differ with it (float64)."""
    block = torch.randint(0, 2, (1, block_length), generator=torch.Generator().manual_seed(block_length))
    one, two = torch.cat([torch.ones(1, 1, dtype=torch.long), block], 1), torch.cat([torch.ones(1, 2, dtype=torch.long), block], 1)
    with torch.no_grad():
        unpadded = random_model("none")
        assert (unpadded(one)[0, -1] - unpadded(two)[0, -1]).abs().max() < 1e-9  # the defect, reproduced
        padded = random_model("pad")
        assert (padded(one)[0, -1] - padded(two)[0, -1]).abs().max() > 1e-3


@pytest.mark.parametrize(("chunk", "thickness"), [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_every_position_equals_the_input_after_enough_pad_tokens(chunk: int, thickness: int) -> None:
    """All logits equal those of the tokens preceded by K·(C**L - 1) PAD tokens at the same depth L."""
    model = random_model("pad", chunk, thickness)
    twin = hand_padded_twin(model)
    for length in (2, 5, 7, 10):
        depth = model.depth(length)
        tokens = torch.randint(0, PAD, (2, length), generator=torch.Generator().manual_seed(length))
        twin.depth = lambda _, depth=depth: depth  # the depth of the unpadded input, not of the padded one
        with torch.no_grad():
            want = twin(left_pad(tokens, thickness * (chunk**depth - 1)))[:, -length:]
            torch.testing.assert_close(model(tokens), want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("chunk", [2, 3])
def test_final_position_equals_padding_to_the_next_power(chunk: int) -> None:
    """With K = 1 the final answer is that of the input left-padded to C**ceil(log_C T) (Figure 6.1's tree)."""
    model = random_model("pad", chunk)
    twin = hand_padded_twin(model)
    for length in range(2, 30):
        tokens = torch.randint(0, PAD, (3, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = twin(left_pad(tokens, chunk ** model.depth(length) - length))[:, -1]
            torch.testing.assert_close(model(tokens)[:, -1], want, atol=1e-10, rtol=1e-10)


def test_the_pad_embedding_is_trained() -> None:
    model = RegularGPT(chunk_size=2, thickness=1, hidden_size=16, num_attention_heads=2, padded_vocab_size=4)
    model(torch.randint(0, 4, (2, 5))).square().sum().backward()  # 5 is not a power of 2
    assert model.pad_embedding.grad is not None and model.pad_embedding.grad.abs().sum() > 0


def test_a_checkpoint_from_before_padding_loads_as_it_was_trained(tmp_path: Path) -> None:
    """The fixture written before padding (no regular_padding recorded) gives its logits under
    regular_padding: none, and a config asking for padding is told how to load it."""
    fixture = torch.load(FIXTURES / "regular-c3-k2.pt", weights_only=True)
    cfg = load_config([], {**fixture["model"], "regular_padding": "none"})
    model = build_model(cfg, flex_compile=False)
    assert ckpt.load_model_weights(model, FIXTURES / "regular-c3-k2", cfg=cfg) == 5
    with torch.no_grad():
        for length, tokens in fixture["tokens"].items():
            torch.testing.assert_close(model.eval()(tokens), fixture["logits"][length], atol=1e-6, rtol=1e-6)
    padded = load_config([], fixture["model"])
    with pytest.raises(ckpt.ArchitectureMismatchError, match="regular_padding: checkpoint 'none' vs config 'pad'.*set regular_padding: none"):
        ckpt.load_model_weights(build_model(padded, flex_compile=False), FIXTURES / "regular-c3-k2", cfg=padded)
