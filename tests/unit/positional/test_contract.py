"""Contract test over every registry name: shapes, dtype, causal-prefix invariance, gradients,
state-dict names, straight-through clamping, fp32 parameters under a bf16 cast."""

from __future__ import annotations

import math

import pytest
import torch

from dense_views import dense_bias, dense_scale
import kerple.positional as positional
from kerple.positional.base import PositionKind
from kerple.positional.kerple import LearnableKernel

H, HEAD_DIM, HIDDEN, MAX_POS = 4, 8, 32, 64
SIZES = dict(num_heads=H, head_dim=HEAD_DIM, hidden_size=HIDDEN, max_positions=MAX_POS)

STATE_DICT_KEYS = {
    "none": set(),
    "learned": {"position_embeddings.weight"},
    "sinusoidal": set(),
    "rotary": {"inv_freq"},
    "alibi": {"slopes"},
    "rpe": {"weight"},
    "kerple_log": {"bias_p", "bias_a"},
    "kerple_power": {"bias_p", "bias_a"},
    "kerple_log3": {"bias_p", "bias_a", "bias_pow"},
    "kerple_bias_wht": {"bias_p", "bias_a", "wei_p", "wei_a"},
    "kerple_wht": {"wei_p", "wei_a"},
    "kerple_power_original": {"bias_a"},
    "gauss_wht1": {"wei_a"},
    "gauss_wht2": {"wei_p", "wei_a"},
    "gauss_bias2": {"bias_scale", "bias_a"},
    "gauss_bias3": {"bias_scale", "bias_p", "bias_a"},
    "sandwich": set(),
    "sandwich_smoothed": set(),
}

STATE_DICT_NAME = {
    "learned": None,
    "rotary": "rotary_emb",
    "alibi": "alibi_embed",
    "rpe": "rpe",
    "kerple_power_original": "rpe",
}

NAMES = positional.names()


def build(name: str) -> positional.PositionalEmbedding:
    torch.manual_seed(0)
    return positional.build(name, **SIZES)


def causal_mask(q_len: int, k_len: int) -> torch.Tensor:
    query = torch.arange(k_len - q_len, k_len)[:, None]
    return torch.arange(k_len)[None, :] <= query  # [q, k]


def test_contract_covers_every_name() -> None:
    assert set(STATE_DICT_KEYS) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_names(name: str) -> None:
    module = build(name)
    assert set(module.state_dict()) == STATE_DICT_KEYS[name]
    if name in STATE_DICT_NAME:
        assert module.state_dict_name == STATE_DICT_NAME[name]
    elif STATE_DICT_KEYS[name] and name.startswith(("kerple", "gauss")):
        assert module.state_dict_name == "rpe"
    for tensor in module.state_dict().values():
        assert tensor.dtype == torch.float32
    if "bias_p" in STATE_DICT_KEYS[name] or "wei_a" in STATE_DICT_KEYS[name]:
        for key in STATE_DICT_KEYS[name]:
            assert tuple(module.state_dict()[key].shape) == (H, 1, 1)


def test_kerple_parameters_are_created_in_reference_order() -> None:
    module = build("kerple_bias_wht")
    assert [name for name, _ in module.named_parameters()] == ["bias_p", "bias_a", "wei_p", "wei_a"]
    assert [name for name, _ in build("kerple_log").named_parameters()] == ["bias_p", "bias_a"]


@pytest.mark.parametrize("name", NAMES)
def test_logit_tables_shapes_dtype_and_causal_prefix_invariance(name: str) -> None:
    module = build(name)
    bias_table, scale_table = module.distance_tables(12)
    if module.kind is PositionKind.BIAS:
        assert bias_table is not None and scale_table is None
    elif module.kind is PositionKind.WEIGHT:
        assert scale_table is not None
    else:
        assert bias_table is None and scale_table is None
    for view in (dense_bias, dense_scale):
        def hook(q_len: int, k_len: int, view=view) -> torch.Tensor | None:
            return view(module, q_len, k_len)

        long_full = hook(12, 12)
        if long_full is None:
            assert hook(3, 5) is None
            continue
        for q_len, k_len in [(1, 1), (3, 5), (5, 5), (1, 7)]:
            block = hook(q_len, k_len)
            assert block.shape == (H, q_len, k_len) and block.dtype == torch.float32
            assert torch.isfinite(block).all()
            mask = causal_mask(q_len, k_len)
            # bottom-right block of the square matrix for the same k ...
            square = hook(k_len, k_len)[:, k_len - q_len :, :]
            assert torch.equal(block[:, mask], square[:, mask])
            # ... and of a longer sequence (only the distance matters)
            longer = long_full[:, 12 - q_len :, 12 - k_len :]
            assert torch.allclose(block[:, mask], longer[:, mask], rtol=1e-6, atol=1e-6)
        table = bias_table if view is dense_bias else scale_table
        assert table.shape == (H, 12) and table.dtype == torch.float32
        assert torch.equal(long_full[:, -1, :], table.flip(-1))  # last query row: distances 11..0


@pytest.mark.parametrize("name", NAMES)
def test_non_logit_hooks(name: str) -> None:
    module = build(name)
    hidden = torch.randn(2, 6, HIDDEN)
    positions = torch.arange(6)
    out = module.embed(hidden, positions)
    assert out.shape == hidden.shape
    if module.kind is not PositionKind.INPUT:
        assert out is hidden
    else:
        # positions 2..5 get the same additive term whatever precedes them
        tail = module.embed(hidden[:, 2:], positions[2:])
        assert torch.allclose(out[:, 2:], tail)
    query, key = torch.randn(2, H, 6, HEAD_DIM), torch.randn(2, H, 6, HEAD_DIM)
    rotated_q, rotated_k = module.rotate(query, key, positions, positions)
    assert rotated_q.shape == query.shape and rotated_k.shape == key.shape
    if module.kind is PositionKind.QUERY_KEY:
        # relative: shifting every position by the same offset keeps q·k
        shifted_q, shifted_k = module.rotate(query, key, positions + 37, positions + 37)
        assert torch.allclose(rotated_q @ rotated_k.transpose(-1, -2), shifted_q @ shifted_k.transpose(-1, -2), atol=1e-4)
    else:
        assert rotated_q is query and rotated_k is key


def loss_through_hooks(module: positional.PositionalEmbedding, k_len: int = 9) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    total = torch.zeros(())
    for table in (dense_bias(module, k_len, k_len), dense_scale(module, k_len, k_len)):
        if table is not None:
            total = total + (table * torch.randn(table.shape, generator=generator)).sum()
    hidden = torch.randn(1, k_len, HIDDEN, generator=generator)
    total = total + (module.embed(hidden, torch.arange(k_len)) * hidden).sum()
    query = torch.randn(1, H, k_len, HEAD_DIM, generator=generator)
    rotated_q, rotated_k = module.rotate(query, query, torch.arange(k_len), torch.arange(k_len))
    return total + (rotated_q * rotated_k).sum()


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_every_learnable_parameter(name: str) -> None:
    module = build(name)
    params = list(module.named_parameters())
    assert bool(params) == module.learnable
    if not params:
        return
    loss_through_hooks(module).backward()
    for param_name, param in params:
        assert param.grad is not None, param_name
        assert torch.isfinite(param.grad).all(), param_name
        assert param.grad.abs().sum() > 0, param_name
        if param.dim() == 3:  # per-head kernel parameters: every head gets a signal
            assert (param.grad.flatten() != 0).all(), param_name


@pytest.mark.parametrize("name", [n for n in NAMES if issubclass(positional.family(n), LearnableKernel)])
def test_no_nan_gradient_at_distance_zero(name: str) -> None:
    module = build(name)
    for low_exponent in (0.01, 2.0):
        for pname, (_, low, high) in module.parameter_specs.items():
            with torch.no_grad():
                getattr(module, pname).fill_(low_exponent if high is not None else max(low, 0.5))
        module.zero_grad()
        bias, scale = module.distance_tables(1)  # distance 0 only
        total = sum(table.sum() for table in (bias, scale) if table is not None)
        total.backward()
        for pname, param in module.named_parameters():
            assert torch.isfinite(param.grad).all(), pname


def clamp_cases() -> list[tuple[str, str, float, float]]:
    cases = []
    for name in NAMES:
        cls = positional.family(name)
        if not issubclass(cls, LearnableKernel):
            continue
        for pname, (_, low, high) in cls.parameter_specs.items():
            cases.append((name, pname, -1.0, low))
            if high is not None:
                cases.append((name, pname, 3.0, high))
    return cases


@pytest.mark.parametrize("name,param_name,raw,clamped", clamp_cases())
def test_straight_through_clamp(name: str, param_name: str, raw: float, clamped: float) -> None:
    """Forward uses the clamped value; the gradient wrt the raw value is 1 x the upstream gradient
    evaluated at the clamped value (i.e. the gradient a parameter *at* the clamp value receives)."""
    results = []
    for value in (raw, clamped):
        module = build(name)
        with torch.no_grad():
            for pname, (_, low, high) in module.parameter_specs.items():
                getattr(module, pname).fill_(0.7)
            getattr(module, param_name).fill_(value)
        results.append((module, loss_through_hooks(module)))
    (raw_module, raw_loss), (clamped_module, clamped_loss) = results
    assert torch.equal(raw_loss, clamped_loss)
    raw_loss.backward()
    clamped_loss.backward()
    raw_grad = getattr(raw_module, param_name).grad
    clamped_grad = getattr(clamped_module, param_name).grad
    assert torch.equal(raw_grad, clamped_grad)
    assert (raw_grad != 0).all()
    # the stored parameter itself is never modified by the forward
    assert (getattr(raw_module, param_name) == raw).all()


@pytest.mark.parametrize("name", NAMES)
def test_cast_to_bf16_keeps_fp32_tensors(name: str) -> None:
    module = build(name)
    before = {key: value.clone() for key, value in module.state_dict().items()}
    module.to(torch.bfloat16)
    for key, value in module.state_dict().items():
        if module.keep_fp32:
            assert value.dtype == torch.float32, key
            assert torch.equal(value, before[key]), key
        else:
            assert value.dtype == torch.bfloat16, key
    for table in (dense_bias(module, 4, 4), dense_scale(module, 4, 4)):
        if table is not None:
            assert table.dtype == torch.float32


@pytest.mark.parametrize("name", NAMES)
def test_metrics(name: str) -> None:
    module = build(name)
    stats = module.metrics()
    if not module.learnable:
        assert stats == {}
        return
    assert all(math.isfinite(value) for value in stats.values())
    for param_name, _ in module.named_parameters():
        if isinstance(module, LearnableKernel):
            assert f"{param_name}/head{H - 1}" in stats
        assert f"{param_name}/mean" in stats and f"{param_name}/max" in stats


def test_learned_refuses_positions_beyond_table() -> None:
    module = build("learned")
    hidden = torch.zeros(1, 2, HIDDEN)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        module.embed(hidden, torch.tensor([MAX_POS - 1, MAX_POS]))
    module.embed(hidden, torch.tensor([MAX_POS - 2, MAX_POS - 1]))
