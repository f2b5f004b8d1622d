"""xPos (Sun et al. 2022, arXiv 2212.10554): the rotation and decay against the paper's formula in complex form."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import kerple.positional as positional
from kerple.config import load_config
from kerple.config.errors import ConfigError
from kerple.positional.xpos import xpos_reach

HEAD_DIM = 8


def build(**options) -> positional.PositionalEmbedding:
    return positional.build("xpos", num_heads=2, head_dim=HEAD_DIM, hidden_size=16, max_positions=64, **options)


def test_decay_by_hand() -> None:
    # ζ_c = (2c/d + γ)/(1 + γ), d = 8, γ = 0.4
    expected = torch.tensor([0.4 / 1.4, 0.65 / 1.4, 0.9 / 1.4, 1.15 / 1.4])
    torch.testing.assert_close(build().decay, expected)


def reference_scores(query: torch.Tensor, key: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``Re Σ_c q_c conj(k_c) e^{i(n-m)θ_c} ζ_c^{(n-m)/B}`` with ``q_c = q[c] + i q[c + d/2]`` (the halves
    layout of GPT-NeoX), ``θ_c = 10000^(-2c/d)``, B = 512: ``[q, k]`` scores of one head."""
    half = HEAD_DIM // 2
    pair = torch.arange(half, dtype=torch.float64)
    theta = 10000.0 ** (-2 * pair / HEAD_DIM)
    zeta = (2 * pair / HEAD_DIM + 0.4) / 1.4
    q_complex = torch.complex(query[..., :half].double(), query[..., half:].double())  # [q, d/2]
    k_complex = torch.complex(key[..., :half].double(), key[..., half:].double())
    distance = (n[:, None] - m[None, :]).double()[..., None]  # [q, k, 1]
    factor = torch.exp(1j * distance * theta) * zeta ** (distance / 512.0)
    return (q_complex[:, None, :] * k_complex.conj()[None, :, :] * factor).real.sum(-1)


@pytest.mark.parametrize("offset", [0, 300, 5000])
def test_scores_equal_the_complex_formula(offset: int) -> None:
    module = build()
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 1, 5, HEAD_DIM, generator=generator)
    key = torch.randn(1, 1, 7, HEAD_DIM, generator=generator)
    n, m = torch.arange(offset + 2, offset + 7), torch.arange(offset, offset + 7)
    rotated_q, rotated_k = module.rotate(query, key, n, m)
    scores = (rotated_q @ rotated_k.transpose(-1, -2))[0, 0]
    torch.testing.assert_close(scores.double(), reference_scores(query[0, 0], key[0, 0], n, m), rtol=1e-4, atol=1e-5)


def test_a_large_scale_base_is_rotary() -> None:
    """ζ^(t/B) -> 1 as B grows: xPos reduces to the rotary embedding it extends."""
    xpos = build(xpos_scale_base=1e12)
    rotary = positional.build("rotary", num_heads=2, head_dim=HEAD_DIM, hidden_size=16, max_positions=64)
    query = torch.randn(1, 2, 6, HEAD_DIM)
    positions = torch.arange(10, 16)
    rotated = zip(xpos.rotate(query, query, positions, positions), rotary.rotate(query, query, positions, positions))
    for ours, theirs in rotated:
        torch.testing.assert_close(ours, theirs)


def test_the_decay_shrinks_distant_scores() -> None:
    """A unit vector on pair 0 keeps its length under the rotation, so ``|q_n|·|k_m|`` is ``ζ_0^((n - m)/B)``."""
    module = build()
    vector = torch.zeros(1, 1, 1, HEAD_DIM)
    vector[..., 0] = 1.0  # pair c = 0: ζ_0 = 0.4/1.4, the fastest decay
    scales = []
    for distance in (0, 256, 512, 1024):
        rotated_q, rotated_k = module.rotate(vector, vector, torch.tensor([distance]), torch.tensor([0]))
        scales.append(float(rotated_q.norm() * rotated_k.norm()))
    assert scales == pytest.approx([(0.4 / 1.4) ** (d / 512) for d in (0, 256, 512, 1024)], rel=1e-5)


def test_reach_in_float16_by_hand() -> None:
    """The largest |t - centre| whose factor (1/ζ_0)^(|t - centre|/B), ζ_0 = γ/(1 + γ), stays within 65504/256:
    512·ln(65504/256)/ln(1.4/0.4) = 2266.3 in float16; 512·ln(3.4028e38/256)/ln(3.5) = 33994.6 in float32."""
    assert xpos_reach(torch.float16, 0.4, 512.0) == 2266
    assert xpos_reach(torch.float32, 0.4, 512.0) == 33994
    assert xpos_reach(torch.float16, 1.0, 256.0) == int(256 * math.log(65504 / 256) / math.log(2.0))  # ζ_0 = 1/2


def test_float16_keys_within_the_reach_stay_finite_and_past_it_overflow() -> None:
    """Keys of magnitude 256 (the headroom) on pair 0 at the last position the refusal allows stay finite in
    float16; at 4,700 positions from the centre even N(0, 1) keys overflow to inf (what the refusal prevents)."""
    module = positional.build("xpos", num_heads=1, head_dim=HEAD_DIM, hidden_size=HEAD_DIM, max_positions=64)
    last = 32 + xpos_reach(torch.float16, 0.4, 512.0)
    key = torch.zeros(1, 1, 1, HEAD_DIM, dtype=torch.float16)
    key[..., 0] = key[..., HEAD_DIM // 2] = 256 / math.sqrt(2)  # |rotated pair 0| = 256 at every angle
    _, rotated = module.rotate(key, key, torch.tensor([last]), torch.tensor([last]))
    assert torch.isfinite(rotated).all() and rotated.float().norm() > 60000  # 256·3.5^(2266/512) = 65,460
    normal = torch.randn(1, 1, 8, HEAD_DIM, generator=torch.Generator().manual_seed(0)).half()
    _, far = module.rotate(normal, normal, torch.arange(8) + 4732, torch.arange(8) + 4732)
    assert not torch.isfinite(far).all()


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pe.yml"
    path.write_text(text)
    return str(path)


def test_config_refuses_lengths_past_the_reach_naming_the_fix(tmp_path: Path) -> None:
    tiny = str(Path(__file__).resolve().parents[3] / "configs/models/tiny.yml")  # max_position_embeddings 128
    fp16 = load_config([tiny, write_config(tmp_path, "pos_emb: xpos\nfp16: {enabled: true}\n")])
    fp16.check_eval_length(64 + 2266 + 1)  # the last position allowed: 64 + 2266
    with pytest.raises(ConfigError) as info:
        fp16.check_eval_length(64 + 2266 + 2)
    message = str(info.value)
    assert "keys 'pos_emb' and 'fp16.enabled'" in message and "bf16" in message and "at most 2331 tokens" in message
    assert "\n" not in message
    bf16 = load_config([tiny, write_config(tmp_path, "pos_emb: xpos\nfp16: {enabled: true, type: bfloat16}\n")])
    bf16.check_eval_length(4 * 4096)
    with pytest.raises(ConfigError, match="float32's range .* use at most 34059 tokens"):
        load_config([tiny, write_config(tmp_path, "pos_emb: xpos\n")]).check_eval_length(40000)
    with pytest.raises(ConfigError, match="float16's range"):  # training positions too
        load_config([tiny, write_config(tmp_path, "pos_emb: xpos\nfp16: {enabled: true}\nseq_length: 8192\n"
                                                  "max_position_embeddings: 8192\n")])
    load_config([tiny, write_config(tmp_path, "pos_emb: rotary\nfp16: {enabled: true}\n")]).check_eval_length(40000)


def test_partial_rotary_decays_only_the_rotated_pairs_by_hand() -> None:
    """rotary_pct 0.5 of head_dim 8: r = 4, ζ = (0.4/1.4, 0.9/1.4) on pairs (0, 2) and (1, 3); channels 4-7 pass."""
    module = build(rotary_pct=0.5)
    torch.testing.assert_close(module.decay, torch.tensor([0.4 / 1.4, 0.9 / 1.4]))
    vector = torch.ones(1, 1, 1, HEAD_DIM)
    query, key = module.rotate(vector, vector, torch.tensor([32 + 1024]), torch.tensor([32]))  # centre 64 // 2
    torch.testing.assert_close(query[..., 4:], vector[..., 4:])  # unrotated and unscaled
    torch.testing.assert_close(key[..., 4:], vector[..., 4:])
    for pair, zeta in ((0, 0.4 / 1.4), (1, 0.9 / 1.4)):  # |pair| = √2 before, ζ^(±1024/512) after (key at the centre)
        length = query[0, 0, 0, [pair, pair + 2]].norm().item()
        assert length == pytest.approx(math.sqrt(2) * zeta**2, rel=1e-5)
        assert key[0, 0, 0, [pair, pair + 2]].norm().item() == pytest.approx(math.sqrt(2), rel=1e-5)
