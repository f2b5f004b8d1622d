"""``attention_impl: triton`` (:mod:`kerple.model.triton_attention`), run in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, set by ``tests/conftest.py`` without a GPU) or on CUDA.

The reference is written here from the formula, not from the kernels: dense float64 attention whose logits
are ``q·kᵀ/√D · scale[h, i - j] + bias[h, i - j]``, causal (and ``i - j < window``), softmax, ``@ v``,
differentiated by autograd. Small shapes (2 x 2 heads x 37 tokens, tiles of 16: three query blocks, the last
one partial): the interpreter runs every tile in numpy.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from kerple.model.triton_attention import fused_attention  # noqa: E402
from model_helpers import VOCAB, tiny_model  # noqa: E402

pytestmark = pytest.mark.triton_kernel
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BATCH, HEADS, LENGTH, BLOCK = 2, 2, 37, 16
# bf16: the reference runs on the same bf16-rounded inputs in float64, so what differs is the kernels' own
# roundings to bf16: the output O (and rowsum(dO ∘ O) computed from it), P before P·V and dS before dS·K on a
# GPU, and dq/dk/dv when stored; each is half a bf16 ulp, 2^-9 ≈ 2e-3 relative. A few of them compound, so
# 2e-2 of the largest entry; fp32 (no rounding but the order of sums) holds 1e-4.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2 / 8}  # fp16: 3 more mantissa bits


def _reference(query, key, value, bias, scale, window):  # type: ignore[no-untyped-def]
    """Output ``[b, H, L, D]`` and log-sum-exp ``[b, H, L]``, float64, by the formula."""
    length, dim = query.shape[-2:]
    position = torch.arange(length)
    distance = position[:, None] - position[None, :]  # [L, L]
    visible = (distance >= 0) & (distance < (window or length))
    index = distance.clamp(min=0)
    logits = query @ key.transpose(-1, -2) / dim**0.5  # [b, H, L, L]
    if scale is not None:
        logits = logits * scale[:, index]
    if bias is not None:
        logits = logits + bias[:, index]
    logits = logits.masked_fill(~visible, float("-inf"))
    return torch.softmax(logits, -1) @ value, torch.logsumexp(logits, -1)


def _inputs(head_dim: int, dtype: torch.dtype, tables: str, seed: int = 0,
            length: int = LENGTH) -> list[torch.Tensor | None]:
    generator = torch.Generator().manual_seed(seed)
    shape = (BATCH, HEADS, length, head_dim)
    query, key, value, grad_output = (torch.randn(shape, generator=generator).to(dtype) for _ in range(4))
    bias = -torch.rand(HEADS, length, generator=generator).cumsum(-1) / 4 if "bias" in tables else None
    scale = 0.5 + torch.rand(HEADS, length, generator=generator) if "scale" in tables else None
    return [query, key, value, grad_output, bias, scale]


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.cpu().double() - expected).abs().max() / expected.abs().max()).item()


def _errors(head_dim: int, dtype: torch.dtype, tables: str, window: int | None, length: int = LENGTH,
            block: int = BLOCK) -> dict[str, float]:
    """Relative errors of the kernel's output, lse and every gradient against the reference (``block`` 0: the
    kernels' own tiles)."""
    query, key, value, grad_output, bias, scale = _inputs(head_dim, dtype, tables, length=length)
    names = ["dq", "dk", "dv", "dbias", "dscale"]
    reference = [None if t is None else t.double().requires_grad_() for t in (query, key, value, bias, scale)]
    expected, expected_lse = _reference(*reference, window)
    expected_grads = torch.autograd.grad(expected, [t for t in reference if t is not None], grad_output.double())
    moved = [None if t is None else t.to(DEVICE).requires_grad_() for t in (query, key, value, bias, scale)]
    output, lse = fused_attention(*moved, window, block)
    got_grads = torch.autograd.grad(output, [t for t in moved if t is not None], grad_output.to(DEVICE))
    assert output.dtype == dtype and all(g.dtype == t.dtype for g, t in zip(got_grads, moved) if t is not None)
    present = [name for name, t in zip(names, moved) if t is not None]
    errors = {"output": _relative(output, expected.detach()), "lse": _relative(lse, expected_lse.detach())}
    errors.update({name: _relative(g, e) for name, g, e in zip(present, got_grads, expected_grads)})
    return errors


@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("tables", ["bias", "scale", "bias+scale"])
def test_fp32_matches_the_formula(tables: str, window: int | None) -> None:
    """Head dim 64; window 9 leaves the third query block's farthest key block unseen (two bands of three)."""
    errors = _errors(64, torch.float32, tables, window)
    assert max(errors.values()) < TOLERANCE[torch.float32], errors


@pytest.mark.parametrize(("head_dim", "dtype", "tables", "window"), [
    (128, torch.float32, "bias+scale", None), (128, torch.bfloat16, "bias+scale", 9), (128, torch.bfloat16, "bias", None),
    (64, torch.bfloat16, "bias+scale", None), (64, torch.float16, "bias+scale", 9),
    (128, torch.float16, "bias+scale", None)])
def test_head_dim_128_and_16_bit_inputs_match_the_formula(head_dim: int, dtype: torch.dtype, tables: str,
                                                           window: int | None) -> None:
    errors = _errors(head_dim, dtype, tables, window)
    assert max(errors.values()) < TOLERANCE[dtype], errors


@pytest.mark.parametrize(("head_dim", "block", "window"), [(64, 0, None), (128, 0, 70), (128, 64, None)])
def test_the_tiles_a_gpu_launches_match_the_formula(head_dim: int, block: int, window: int | None) -> None:
    """The tiles a GPU gets (64 wide at head_dim 64, 32 at 128) and the 64-wide alternative at head_dim 128,
    over 150 tokens (the last block partial), bf16."""
    errors = _errors(head_dim, torch.bfloat16, "bias+scale", window, length=150, block=block)
    assert max(errors.values()) < TOLERANCE[torch.bfloat16], errors


@pytest.mark.parametrize(("head_dim", "dtype", "tables", "window", "launches"), [
    (64, torch.float32, "bias+scale", None, 3), (64, torch.float32, "bias", 40, 3),
    (128, torch.bfloat16, "bias+scale", None, 2)])
def test_key_blocks_sharing_the_partial_rows_match_the_formula(head_dim: int, dtype: torch.dtype, tables: str,
                                                               window: int | None, launches: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A partial buffer capped below its size: the key-side backward gets 3 rows (12 programs over 4
    batch·heads), so 100 tokens take 3 launches in 16-wide tiles (7 key blocks) and 2 in the 32-wide tiles
    a GPU uses at head_dim 128 in bf16 (4 key blocks), the last reaching past the end, each adding into the
    rows the one before wrote."""
    from kerple.model import bias_gradient_triton
    from kerple.model import triton_attention_kernels as kernels

    monkeypatch.setattr(bias_gradient_triton, "PARTIALS_BYTES", 1)
    monkeypatch.setattr(kernels, "KEY_PROGRAMS", 12)
    grids = []
    original = kernels._backward_keys

    class Counting:
        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            grids.append(grid)
            return original[grid]

    monkeypatch.setattr(kernels, "_backward_keys", Counting())
    errors = _errors(head_dim, dtype, tables, window, length=100, block=BLOCK if dtype == torch.float32 else 0)
    assert grids == [(3, BATCH * HEADS)] * launches
    assert max(errors.values()) < TOLERANCE[dtype], errors


@pytest.mark.parametrize(("length", "batch_heads", "block", "window", "expected"), [
    (512, 32 * 12, 64, None, 8),  # 12.6 MB: one program per key block
    (16_384, 12, 64, None, 170),  # 403 MB > 256 MiB: 256 MiB // 1.57 MB per row
    (65_536, 12, 64, None, 86),  # 6.4 GB: 42 rows would fit; the floor of 1,024 programs gives 86
    (65_536, 12, 64, 512, 1_024),  # a window of 512: 9 bands, 57 MB
])
def test_the_partial_buffer_stops_growing_with_the_square_of_the_length(
        length: int, batch_heads: int, block: int, window: int | None, expected: int) -> None:
    """Rows of the key-side partial buffer (``[rows, bands, b·H, 2B]`` float32), worked out by hand."""
    from kerple.model.bias_gradient_triton import tile_layout
    from kerple.model.triton_attention_kernels import key_programs

    blocks, bands = tile_layout(length, block, window)
    assert key_programs(blocks, bands, batch_heads, block) == expected


@pytest.mark.parametrize("layout", ["packed", "mixed"])
def test_strided_inputs_are_read_in_place(layout: str) -> None:
    """``q``, ``k``, ``v`` as the model hands them over (views of one ``[b, L, H, 3D]`` projection, ``dO`` a
    view of ``[b, L, H, D]``) reach the kernels without a copy (no ``aten::contiguous`` in the profile) and give
    the formula's values; the output is laid out ``[b, L, H, D]``, so the model's reshape back is a view.
    ``mixed`` (``k`` a tensor of its own, as after a rotation) is copied to one layout, with the same values."""
    query, key, value, grad_output, bias, _ = _inputs(64, torch.float32, "bias")
    packed = torch.cat([t.transpose(1, 2) for t in (query, key, value)], dim=-1).transpose(1, 2)  # [b, H, L, 3D]
    views = list(packed.to(DEVICE).split(query.shape[-1], dim=-1))
    if layout == "mixed":
        views[1] = views[1].contiguous()
    leaves = [t.detach().requires_grad_() for t in views] + [bias.to(DEVICE).requires_grad_()]
    strided_grad = grad_output.transpose(1, 2).contiguous().transpose(1, 2).to(DEVICE)
    with torch.profiler.profile() as profile:
        output, _ = fused_attention(*leaves, None, None, BLOCK)
        grads = torch.autograd.grad(output, leaves, strided_grad)
    copies = [event.name for event in profile.events() if event.name == "aten::contiguous"]
    assert (copies == []) == (layout == "packed"), copies
    assert output.transpose(1, 2).is_contiguous()
    reference = [t.double().requires_grad_() for t in (query, key, value, bias)]
    expected, _ = _reference(*reference[:3], reference[3], None, None)
    expected_grads = torch.autograd.grad(expected, reference, grad_output.double())
    assert _relative(output, expected.detach()) < TOLERANCE[torch.float32]
    for got, wanted in zip(grads, expected_grads):
        assert _relative(got, wanted) < TOLERANCE[torch.float32]


def test_gradients_are_deterministic_and_compile_as_one_call() -> None:
    """Two backward passes give the same bits (no atomics; meaningful on a GPU), and ``torch.compile`` traces
    the custom ops whole (``fullgraph``: no graph break) to the same values."""
    query, key, value, grad_output, bias, scale = _inputs(64, torch.float32, "bias+scale", seed=1)

    def gradients(function):  # type: ignore[no-untyped-def]
        leaves = [t.to(DEVICE).requires_grad_() for t in (query, key, value, bias, scale)]
        output, _ = function(*leaves[:3], leaves[3], leaves[4], 9, BLOCK)
        return [output, *torch.autograd.grad(output, leaves, grad_output.to(DEVICE))]

    first, second = gradients(fused_attention), gradients(fused_attention)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    compiled = gradients(torch.compile(fused_attention, backend="aot_eager", fullgraph=True))
    assert all(torch.equal(a, b) for a, b in zip(first, compiled))


def test_no_table_is_plain_causal_attention() -> None:
    """Neither table: the kernel is causal softmax attention, as PyTorch's own."""
    query, key, value, *_ = _inputs(64, torch.float32, "")
    output, _ = fused_attention(*(t.to(DEVICE) for t in (query, key, value)), None, None, None, BLOCK)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    torch.testing.assert_close(output.cpu(), expected, atol=1e-5, rtol=1e-5)


def _one_step(name: str, impl: str, window: int | None) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss of one training step of a tiny 2-layer model and its parameters' gradients."""
    model = tiny_model(name, impl=impl, window=window).to(DEVICE).train()
    tokens = torch.randint(0, VOCAB, (2, 25), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.item(), {key: p.grad.cpu() for key, p in model.named_parameters()}


@pytest.mark.parametrize(("name", "reference", "window"), [
    ("kerple_log", "sdpa", None), ("kerple_log", "sdpa", 6), ("kerple_bias_wht", "eager", None)])
def test_a_training_step_matches_the_other_kernels(name: str, reference: str, window: int | None) -> None:
    """kerple_log (a bias table) against sdpa, kerple_bias_wht (a scale table too; sdpa cannot scale) against eager:
    the same loss and the same gradients, the positional parameters' among them."""
    loss, grads = _one_step(name, "triton", window)
    expected_loss, expected = _one_step(name, reference, window)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    positional = [key for key in expected if key.startswith("positional.")]
    assert positional and all(expected[key].abs().max() > 0 for key in positional)
    for key in expected:
        torch.testing.assert_close(grads[key], expected[key], atol=1e-5, rtol=1e-4, msg=key)


def test_refusals_and_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused on a CPU without Triton's interpreter and with attention dropout in training; ``auto`` never
    chooses it (not yet timed on a GPU)."""
    from kerple.model.attention import choose_implementation, unsupported_reason
    from kerple.positional.base import PositionKind

    assert unsupported_reason("triton", PositionKind.WEIGHT, "cuda", True) is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "needs CUDA" in unsupported_reason("triton", PositionKind.BIAS, "cpu", True)
    monkeypatch.undo()
    choices = {choose_implementation(kind, device, training, length, window=window, compiled_layers=compiled,
                                     learnable=True)
               for kind in PositionKind for device in ("cpu", "cuda") for training in (False, True)
               for length in (64, 1 << 16) for window in (None, 8) for compiled in (False, True)}
    assert "triton" not in choices and {"eager", "sdpa", "flex"} <= choices
    model = tiny_model("kerple_log", impl="triton", attention_dropout=0.1).train()
    with pytest.raises(ValueError, match="set attention_dropout: 0"):
        model(torch.zeros(1, 8, dtype=torch.long))


SMALL = {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 32, "seq_length": 16,
         "max_position_embeddings": 16, "pos_emb": "kerple_log", "attention_impl": "triton", "attention_dropout": 0.0}


def test_config_accepts_triton() -> None:
    from kerple.config import load_config
    from kerple.model import families

    cfg = load_config([], dict(SMALL))
    assert families.build_model(cfg, flex_compile=False).attention_impl == "triton"


@pytest.mark.parametrize(("changes", "expected"), [
    ({"pos_emb": "fire"}, "pos_emb='fire' (<command line>) has none (a closed form of the positions); use attention_impl"),
    ({"pos_emb": "cable"}, "pos_emb='cable' (<command line>) has none (a closed form of the positions); use "),
    ({"attention_dropout": 0.1}, "attention_dropout=0.1 (<command line>) asks for it in training; set attention_dropout: 0"),
])
def test_config_refuses_what_the_kernel_leaves_out(changes: dict, expected: str) -> None:
    """A term without distance tables (FIRE, CABLE), and attention dropout in training, are refused when the
    config loads, naming both keys and a setting that works; dropout is accepted for evaluation."""
    from kerple.config import ConfigError, load_config

    with pytest.raises(ConfigError) as refusal:
        load_config([], {**SMALL, **changes})
    assert expected in str(refusal.value) and "attention_impl='triton' (<command line>)" in str(refusal.value)
    if "attention_dropout" in changes:
        assert load_config([], {**SMALL, **changes, "train_iters": 0}).attention.attention_impl == "triton"


def test_every_command_line_offers_every_kernel() -> None:
    """evaluate.py's ``--attention-impl`` and the config's ``attention_impl`` list the model's kernels and ``auto``
    (evaluate.py writes them out to answer ``--help`` without torch)."""
    import dataclasses
    import typing

    from kerple.config.sections import AttentionConfig
    from kerple.evaluation.arguments import ATTENTION_IMPL_CHOICES
    from kerple.model.attention import ATTENTION_IMPLS, AUTO

    field = next(f for f in dataclasses.fields(AttentionConfig) if f.name == "attention_impl")
    annotation = typing.get_type_hints(AttentionConfig)[field.name]
    assert set(ATTENTION_IMPL_CHOICES) == set(typing.get_args(annotation)) == {*ATTENTION_IMPLS, AUTO}


@pytest.mark.slow
@pytest.mark.process
def test_the_loops_over_tiles_are_pipelined_for_sm90() -> None:
    """Compiled offline for an H100/H200 (Triton and its ``ptxas``, no GPU): in every kernel the key or query
    tiles' loads are ``cp.async`` copies issued ahead of the compute (Triton's software pipelining, which a
    branch inside the loop prevents: the kernels had 0), the dots run on Hopper's wgmma at head_dim 64, and with
    a bias table alone (KERPLE-log, ALiBi, T5) no launch spills a register, but the key-side backward that
    adds into shared partial rows (long sequences). fp32 at head_dim 128 runs one stage: no copy issued ahead."""
    from kerple.measure.triton_offline import kernel_resources
    from kerple.model.triton_attention_kernels import offline_requests

    cases = [(torch.bfloat16, 64, False), (torch.float16, 64, False), (torch.bfloat16, 128, False),
             (torch.bfloat16, 64, True), (torch.float32, 128, False)]
    labelled = [(case, name, request) for case in cases for name, request in offline_requests(*case).items()]
    labelled.append(((torch.bfloat16, 64, False), "_backward_keys, rows shared",
                     offline_requests(torch.bfloat16, 64, False, accumulate=True)["_backward_keys"]))
    found = kernel_resources([request for *_, request in labelled])
    for ((dtype, head_dim, scale), name, _), resources in zip(labelled, found):
        label = (dtype, head_dim, scale, name, resources)
        assert resources.error is None, label
        if dtype == torch.float32:
            assert resources.async_copies == 0 and resources.tensor_cores == "", label
            continue
        assert resources.async_copies > 0, label
        assert resources.tensor_cores == ("wgmma" if head_dim == 64 else "mma"), label
        if not scale and "shared" not in name:  # sharing rows (long sequences only) spills 20 B a thread
            assert resources.spill_stores == resources.spill_loads == 0, label
