"""``attention_impl: auto``: the choice table, its resolution in the model and the config,
``compile: true`` via :func:`maybe_compile`, and chunked evaluation through FlexAttention."""

from __future__ import annotations

import itertools
import types

import pytest
import torch
import torch.nn.functional as F

from kerple import positional
from kerple.config import ConfigError, load_config
from kerple.model import build_model, choose_implementation, maybe_compile, unsupported_reason
from kerple.model.attention import CPU_FLEX_MIN_LENGTH, CUDA_TRAIN_FLEX_MIN_LENGTH
from model_helpers import VOCAB, tiny_model


TINY = {
    "num_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "seq_length": 32,
    "vocab_size": 60,
    "make_vocab_size_divisible_by": 8,
}
LONG = CPU_FLEX_MIN_LENGTH
CUDA_LONG = CUDA_TRAIN_FLEX_MIN_LENGTH


def _choice(name: str, device: str, training: bool, seq_len: int, **kwargs) -> str:
    family = positional.family(name)
    return choose_implementation(family.kind, device, training, seq_len, **kwargs)


@pytest.mark.parametrize(
    ("name", "device", "training", "seq_len", "expected"),
    [
        # CUDA: flex for every logit term in evaluation, for weight kernels and long training lengths;
        # a bias trains through sdpa below CUDA_TRAIN_FLEX_MIN_LENGTH (measured faster on an H200)
        ("kerple_log", "cuda", True, 512, "sdpa"),
        ("alibi", "cuda", True, 512, "sdpa"),
        ("rpe", "cuda", True, CUDA_LONG - 1, "sdpa"),
        ("kerple_log", "cuda", True, CUDA_LONG, "flex"),
        ("kerple_log", "cuda", False, 512, "flex"),
        ("kerple_bias_wht", "cuda", True, 512, "flex"),
        ("rpe", "cuda", False, 65536, "flex"),
        # CUDA: sdpa (flash) for embeddings without a logit term
        ("none", "cuda", True, 512, "sdpa"),
        ("rotary", "cuda", False, 65536, "sdpa"),
        ("sinusoidal", "cuda", True, 512, "sdpa"),
        ("learned", "cuda", False, 512, "sdpa"),
        # CPU training: sdpa where it can, eager for multiplicative (weight) kernels
        ("kerple_log", "cpu", True, 512, "sdpa"),
        ("rotary", "cpu", True, 512, "sdpa"),
        ("kerple_bias_wht", "cpu", True, 512, "eager"),
        ("gauss_wht1", "cpu", True, LONG, "eager"),
        # CPU evaluation: flex from CPU_FLEX_MIN_LENGTH on, else as in training
        ("kerple_log", "cpu", False, LONG, "flex"),
        ("kerple_wht", "cpu", False, LONG, "flex"),
        ("none", "cpu", False, 2 * LONG, "flex"),
        ("kerple_log", "cpu", False, LONG - 1, "sdpa"),
        ("kerple_wht", "cpu", False, 512, "eager"),
    ],
)
def test_choice_table_rows(name: str, device: str, training: bool, seq_len: int, expected: str) -> None:
    assert _choice(name, device, training, seq_len) == expected


def test_window_dropout_and_uncompiled_flex_change_the_choice() -> None:
    assert _choice("rotary", "cuda", True, 512, window=64) == "flex"
    assert _choice("kerple_log", "cuda", True, 512, dropout_p=0.1) == "sdpa"
    assert _choice("kerple_wht", "cuda", True, 512, dropout_p=0.1) == "eager"
    assert _choice("kerple_log", "cuda", False, 512, dropout_p=0.1) == "flex"  # no dropout in evaluation
    assert _choice("kerple_log", "cpu", False, LONG, flex_compiled=False) == "sdpa"
    assert _choice("kerple_wht", "cuda", False, 512, flex_compiled=False) == "eager"


def test_every_choice_is_supported() -> None:
    """Over every registry entry and setting, auto never picks a kernel that would refuse."""
    settings = itertools.product(
        positional.names(), ("cuda", "cpu", "mps"), (True, False), (512, LONG), (None, 16), (0.0, 0.1), (True, False),
        (True, False),
    )
    for name, device, training, seq_len, window, dropout, compiled, layers in settings:
        family = positional.family(name)
        impl = choose_implementation(
            family.kind, device, training, seq_len,
            window=window, dropout_p=dropout, flex_compiled=compiled, compiled_layers=layers, learnable=layers,
        )
        assert unsupported_reason(impl, family.kind, device, training) is None, (name, device)
        assert not (impl == "flex" and training and dropout > 0)
        assert not (impl == "flex" and not compiled)


def test_model_resolves_auto_per_mode_and_length() -> None:
    model = tiny_model("kerple_bias_wht", impl="auto", flex_compile=True)
    assert model.attention_impl == "auto"
    assert model.resolve_attention_impl("cpu", True, 64) == "eager"
    assert model.resolve_attention_impl("cpu", False, LONG) == "flex"
    assert model.resolve_attention_impl("cuda", True, 64) == "flex"
    uncompiled = tiny_model("kerple_bias_wht", impl="auto")  # helpers build flex uncompiled
    assert uncompiled.resolve_attention_impl("cpu", False, LONG) == "eager"
    fixed = tiny_model("alibi", impl="sdpa")
    assert fixed.resolve_attention_impl("cuda", True, 64) == "sdpa"


@pytest.mark.parametrize(("name", "compiled", "want"), [
    ("kerple_log", False, "sdpa"),  # eager sdpa trains the dense bias (the GPU check's step 4)
    ("kerple_log", True, "flex"),  # compiled sdpa left kerple_log's masters unchanged on an H200
    ("rpe", True, "flex"),  # T5's learnable buckets: the same dense-mask gradient
    ("alibi", True, "sdpa"),  # no parameters: nothing to train through the mask
    ("learned", True, "sdpa"),  # learnable, but added to the input: no mask to train through
    ("none", True, "sdpa"),
])
def test_compiled_layers_train_a_learnable_bias_through_flex_on_cuda(name: str, compiled: bool, want: str) -> None:
    model = tiny_model(name, impl="auto", flex_compile=True)
    model.compiled_layers = compiled  # what maybe_compile sets
    assert model.resolve_attention_impl("cuda", True, 512) == want
    assert model.resolve_attention_impl("cuda", False, 512) == ("flex" if name in ("kerple_log", "rpe", "alibi") else "sdpa")
    assert model.resolve_attention_impl("cpu", True, 512) in ("sdpa", "eager")  # CPU training has no flex backward


def test_maybe_compile_tells_the_model_its_layers_are_compiled() -> None:
    from types import SimpleNamespace

    from kerple.model import maybe_compile

    model = tiny_model("kerple_log", impl="auto", flex_compile=True)
    assert model.compiled_layers is False
    maybe_compile(model, SimpleNamespace(training=SimpleNamespace(compile=True)))
    assert model.compiled_layers is True and model.resolve_attention_impl("cuda", True, 512) == "flex"


@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht", "rotary"])
def test_auto_model_trains_and_matches_eager(name: str) -> None:
    """On CPU, auto trains (sdpa or eager, never flex) with the same logits and gradients as eager."""
    tokens = torch.randint(0, VOCAB, (2, 25), generator=torch.Generator().manual_seed(0))
    grads = {}
    for impl in ("eager", "auto"):
        model = tiny_model(name, impl=impl, flex_compile=True).train()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        grads[impl] = (logits.detach(), [p.grad for p in model.parameters()])
    torch.testing.assert_close(grads["auto"][0], grads["eager"][0], rtol=1e-5, atol=1e-5)
    for auto_grad, eager_grad in zip(grads["auto"][1], grads["eager"][1]):
        torch.testing.assert_close(auto_grad, eager_grad, rtol=1e-4, atol=1e-6)


def test_config_accepts_auto_where_a_fixed_kernel_is_refused() -> None:
    with pytest.raises(ConfigError, match="weight kernel"):
        load_config([], {**TINY, "pos_emb": "kerple_wht", "attention_impl": "sdpa"})
    cfg = load_config([], {**TINY, "pos_emb": "kerple_wht", "attention_impl": "auto"})
    model = build_model(cfg)
    assert model.attention_impl == "auto"
    loss = model.chunked_loss(torch.randint(0, 60, (1, 12)), torch.randint(0, 60, (1, 12))).mean()
    loss.backward()  # CPU training resolves to eager for a weight kernel
    assert model.positional.parameters().__next__().grad is not None


@pytest.mark.parametrize("name", ["kerple_log", "kerple_bias_wht", "sandwich"])
def test_chunked_flex_loss_equals_unchunked_eager(name: str) -> None:
    """Chunked LM head + loss through FlexAttention equals eager full logits."""
    tokens = torch.randint(0, VOCAB, (2, 300), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, VOCAB, (2, 300), generator=torch.Generator().manual_seed(1))
    flex_model = tiny_model(name, impl="flex").eval()
    eager_model = tiny_model(name, impl="eager").eval()
    with torch.no_grad():
        chunked = flex_model.chunked_loss(tokens, labels, chunk_size=64)
        full = F.cross_entropy(eager_model(tokens).flatten(0, 1), labels.flatten(), reduction="none").view(2, 300)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)


def test_maybe_compile_compiles_layers_in_place_only_when_asked() -> None:
    model = tiny_model("alibi")
    keys = list(model.state_dict())
    off = types.SimpleNamespace(training=types.SimpleNamespace(compile=False))
    assert maybe_compile(model, off) is model
    assert all(layer._compiled_call_impl is None for layer in model.layers)
    on = types.SimpleNamespace(training=types.SimpleNamespace(compile=True))
    assert maybe_compile(model, on) is model
    assert all(layer._compiled_call_impl is not None for layer in model.layers)
    assert list(model.state_dict()) == keys  # checkpoints keep their keys


def _tile_sets(num_blocks: torch.Tensor, indices: torch.Tensor) -> list[set[int]]:
    counts, rows = num_blocks.flatten().tolist(), indices.flatten(0, 2)
    return [set(rows[i, :count].tolist()) for i, count in enumerate(counts)]


@pytest.mark.parametrize(
    ("q_len", "k_len", "window"),
    [(256, 256, None), (300, 300, None), (300, 300, 40), (1, 300, None), (130, 300, 129), (1000, 1000, 1), (257, 513, 300)],
)
def test_distance_block_mask_equals_dense_create_block_mask(q_len: int, k_len: int, window: int | None) -> None:
    """The analytic block mask (no L×L evaluation) has exactly create_block_mask's partial and full tiles."""
    from torch.nn.attention.flex_attention import create_block_mask

    from kerple.model.flex import distance_block_mask

    offset = k_len - q_len

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx + offset
        allowed = distance >= 0
        return allowed & (distance < window) if window is not None else allowed

    dense = create_block_mask(mask_mod, None, None, q_len, k_len, device="cpu")
    analytic = distance_block_mask(q_len, k_len, window, "cpu")
    assert _tile_sets(analytic.kv_num_blocks, analytic.kv_indices) == _tile_sets(dense.kv_num_blocks, dense.kv_indices)
    assert _tile_sets(analytic.full_kv_num_blocks, analytic.full_kv_indices) == _tile_sets(
        dense.full_kv_num_blocks, dense.full_kv_indices
    )
    assert analytic.seq_lengths == (q_len, k_len)
