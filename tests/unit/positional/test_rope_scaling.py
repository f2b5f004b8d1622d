"""``rope_scaling`` (docs/context-extension.md): every ``rope_type`` of ``transformers`` against
``transformers``' own rotary embedding for the same config, the papers' formulas restated, the
config's refusals, and the scaling through every attention kernel and the KV cache."""

from __future__ import annotations

import math

import pytest
import torch

import kerple.positional as positional
from kerple.config import ConfigError, load_config
from kerple.model import build_model
from kerple.positional.rope_scaling import rope_types

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402

HEAD_DIM, HEADS, TRAIN_LENGTH = 16, 2, 32


def example(rope_type: str, rotary_pct: float) -> dict:
    """A valid ``rope_scaling`` of each type, the original length 32, extending 4x."""
    pairs = int(HEAD_DIM * rotary_pct) // 2
    examples = {
        "default": {},
        "linear": {"factor": 4.0},
        "dynamic": {"factor": 2.0},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": TRAIN_LENGTH},
        "longrope": {"factor": 4.0, "original_max_position_embeddings": TRAIN_LENGTH,
                     "short_factor": [1.0 + 0.1 * i for i in range(pairs)], "long_factor": [1.0 + i for i in range(pairs)]},
        "llama3": {"factor": 4.0, "original_max_position_embeddings": TRAIN_LENGTH, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0},
        "proportional": {},
    }
    assert rope_type in examples, f"transformers offers rope_type {rope_type!r}: add an example here"
    return {"rope_type": rope_type, **examples[rope_type]}


def kerple_rotary(rope_scaling: dict, rotary_pct: float, max_positions: int = TRAIN_LENGTH) -> positional.PositionalEmbedding:
    return positional.build("rotary", num_heads=HEADS, head_dim=HEAD_DIM, hidden_size=HEAD_DIM * HEADS,
                            max_positions=max_positions, rotary_pct=rotary_pct, rope_scaling=rope_scaling)


def stock_rotary(rope_scaling: dict, rotary_pct: float) -> GPTNeoXRotaryEmbedding:
    """transformers' GPTNeoX rotary embedding of the same settings (its own dynamic update included)."""
    config = transformers.GPTNeoXConfig(hidden_size=HEAD_DIM * HEADS, num_attention_heads=HEADS,
                                        max_position_embeddings=TRAIN_LENGTH, rotary_pct=rotary_pct,
                                        rotary_emb_base=10000.0, rope_scaling=dict(rope_scaling))
    return GPTNeoXRotaryEmbedding(config)


@pytest.mark.parametrize("rotary_pct", [1.0, 0.5])
@pytest.mark.parametrize("rope_type", rope_types())
def test_cos_and_sin_are_transformers_own(rope_type: str, rotary_pct: float) -> None:
    """kerple's cos/sin (frequencies times positions, times the attention factor) are the ones
    ``GPTNeoXRotaryEmbedding`` computes for the same config, below and beyond the original length."""
    rope_scaling = example(rope_type, rotary_pct)
    ours, theirs = kerple_rotary(rope_scaling, rotary_pct), stock_rotary(rope_scaling, rotary_pct)
    for length in (TRAIN_LENGTH // 2, TRAIN_LENGTH, 5 * TRAIN_LENGTH):
        positions = torch.arange(length)
        cos, sin = theirs(torch.zeros(1, length, HEAD_DIM), positions[None])
        our_cos, our_sin = ours._cos_sin(positions)
        assert our_cos.shape == cos[0].shape, (rope_type, length)
        torch.testing.assert_close(our_cos, cos[0], rtol=0, atol=0)
        torch.testing.assert_close(our_sin, sin[0], rtol=0, atol=0)
        if rope_type != "default":
            assert ours.frequencies(length)[1] == theirs.attention_scaling


VALID_EDGES = [
    {"rope_type": "llama3", "factor": 1, "original_max_position_embeddings": 32, "low_freq_factor": 1, "high_freq_factor": 4},
    {"rope_type": "llama3", "factor": 2.5, "original_max_position_embeddings": 32, "low_freq_factor": 1, "high_freq_factor": 4},
    {"rope_type": "yarn", "factor": 3, "original_max_position_embeddings": 100, "attention_factor": 1},
    {"rope_type": "yarn", "factor": 1.3, "original_max_position_embeddings": 7, "beta_fast": 4, "beta_slow": 4},
    {"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": 16, "mscale": 1, "mscale_all_dim": 0.5,
     "truncate": False},
    {"rope_type": "longrope", "factor": 1, "original_max_position_embeddings": 8, "short_factor": [1] * 8,
     "long_factor": [2] * 8, "attention_factor": 1},
]


@pytest.mark.parametrize("rope_scaling", [example(name, 1.0) for name in rope_types()] + VALID_EDGES)
def test_what_kerple_accepts_transformers_validates_without_a_word(rope_scaling: dict) -> None:
    """kerple states transformers' rules itself (no log parsing): every value it accepts builds a stock
    ``GPTNeoXConfig`` (kerple's, and the export's ``config.json``) on which ``validate_rope`` logs nothing."""
    import json
    import logging

    from kerple.checkpoint.huggingface import _hf_config
    from transformers.utils import logging as hf_logging

    cfg = load_config([], {"pos_emb": "rotary", "hidden_size": 32, "num_attention_heads": 2, "num_layers": 1,
                           "vocab_size": 64, "make_vocab_size_divisible_by": 8, "seq_length": TRAIN_LENGTH,
                           "rope_scaling": rope_scaling})
    state = build_model(cfg, flex_compile=False).state_dict()
    exported = _hf_config("gpt_neox", {**cfg.to_dict(), "padded_vocab_size": 64}, state)
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    rope_logger = logging.getLogger("transformers.modeling_rope_utils")
    rope_logger.addHandler(handler)
    hf_logging.warning_once.cache_clear()  # a note once per process must show here too
    try:
        kerple_frequencies = kerple_rotary(rope_scaling, 1.0).rope_frequencies
        if kerple_frequencies is not None:
            kerple_frequencies.config.validate_rope()
        transformers.GPTNeoXConfig(**json.loads(json.dumps(exported))).validate_rope()
    finally:
        rope_logger.removeHandler(handler)
    assert messages == []


def test_every_rope_type_of_transformers_is_accepted() -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(rope_types()) == {"default", *ROPE_INIT_FUNCTIONS}
    for rope_type in rope_types():
        cfg = load_config([], {"pos_emb": "rotary", "hidden_size": 32, "num_attention_heads": 2, "num_layers": 1,
                               "seq_length": TRAIN_LENGTH, "rope_scaling": example(rope_type, 1.0)})
        assert cfg.positional.rope_scaling["rope_type"] == rope_type


def test_position_interpolation_divides_the_positions() -> None:
    """PI (Chen et al. 2023 §2.3): f'(x, m) = f(x, m/s); here rotating at m equals plain rotary at m/4."""
    scaled, plain = kerple_rotary({"rope_type": "linear", "factor": 4.0}, 1.0), kerple_rotary(None, 1.0)
    positions = torch.arange(0, 400, 4)
    cos, sin = scaled._cos_sin(positions)
    plain_cos, plain_sin = plain._cos_sin(positions / 4)
    torch.testing.assert_close(cos, plain_cos, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin, plain_sin, rtol=1e-5, atol=1e-5)


def test_yarn_temperature_multiplies_the_logits_by_its_square() -> None:
    """YaRN (Peng et al. 2023 §3, its attention scaling): softmax(q·k / (t·sqrt(d))) with sqrt(1/t) = 0.1·ln(s) + 1; with every channel rotated,
    scaling cos and sin by sqrt(1/t) scales q·k by 1/t. Compared with the same frequencies unscaled."""
    factor = 8.0
    yarn = kerple_rotary({"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": TRAIN_LENGTH}, 1.0)
    unscaled = kerple_rotary({"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": TRAIN_LENGTH,
                              "attention_factor": 1.0}, 1.0)
    query, key = torch.randn(1, HEADS, 20, HEAD_DIM), torch.randn(1, HEADS, 20, HEAD_DIM)
    positions = torch.arange(100, 120)
    scores = torch.matmul(*_rotated(yarn, query, key, positions))
    plain = torch.matmul(*_rotated(unscaled, query, key, positions))
    torch.testing.assert_close(scores, plain * (0.1 * math.log(factor) + 1.0) ** 2, rtol=1e-5, atol=1e-5)


def _rotated(module, query, key, positions):
    q, k = module.rotate(query, key, positions, positions)
    return q, k.transpose(-1, -2)


def test_dynamic_ntk_rescales_the_base_beyond_the_original_length() -> None:
    """Dynamic NTK (YaRN paper §3, "NTK-aware" and "Dynamic NTK"): base b' = b·(s·l/L − (s − 1))^(d/(d−2)) at length l > L, b up to L."""
    module = kerple_rotary({"rope_type": "dynamic", "factor": 2.0}, 1.0)
    plain = 1.0 / 10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    torch.testing.assert_close(module.frequencies(TRAIN_LENGTH)[0], plain)
    length = 3 * TRAIN_LENGTH
    base = 10000.0 * (2.0 * length / TRAIN_LENGTH - 1.0) ** (HEAD_DIM / (HEAD_DIM - 2))
    expected = 1.0 / base ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    torch.testing.assert_close(module.frequencies(length)[0], expected, rtol=1e-5, atol=0)


def test_the_stored_frequencies_stay_the_base_ones() -> None:
    """A checkpoint trained without scaling loads into a model with it, and back."""
    scaled = kerple_rotary(example("yarn", 1.0), 1.0)
    plain = kerple_rotary(None, 1.0)
    torch.testing.assert_close(scaled.state_dict()["inv_freq"], plain.state_dict()["inv_freq"])
    plain.load_state_dict(scaled.state_dict())


def test_proportional_rotates_the_whole_head_and_keeps_the_rotary_width() -> None:
    """``rotary_ndims`` stays ``int(head_dim x rotary_pct)``, the width of the stored ``inv_freq``; the
    proportional frequencies span the whole head (the channels past it at frequency 0)."""
    module = kerple_rotary(example("proportional", 0.5), 0.5)
    assert module.rotary_ndims == HEAD_DIM // 2 == 2 * module.inv_freq.numel()
    assert module.rotated_ndims == HEAD_DIM
    inv_freq, _ = module.frequencies(TRAIN_LENGTH)
    assert inv_freq.numel() == HEAD_DIM // 2 and bool((inv_freq[HEAD_DIM // 4:] == 0).all())


def test_the_shape_check_takes_what_the_constructor_takes() -> None:
    """``options_problem`` reads the options object the constructor is given, against the model's shape."""
    from kerple.positional.base import ModelShape
    from kerple.positional.rotary import RotaryEmbedding, RotaryOptions

    shape = ModelShape(num_heads=HEADS, head_dim=HEAD_DIM, hidden_size=HEAD_DIM * HEADS, max_positions=TRAIN_LENGTH)
    odd = RotaryOptions(rotary_pct=3 / HEAD_DIM)
    assert RotaryEmbedding.options_problem(odd, shape)[0] == "rotary_pct"
    with pytest.raises(ValueError, match="must be even"):
        RotaryEmbedding(shape, odd)
    bad = RotaryOptions(rope_scaling={"rope_type": "linear", "factor": 0.5})
    assert RotaryEmbedding.options_problem(bad, shape) == (
        "rope_scaling", "rope_scaling.factor must be at least 1 (1: no extension), got 0.5")
    assert RotaryEmbedding.options_problem(RotaryOptions(rope_scaling=example("yarn", 1.0)), shape) is None


def test_a_run_is_named_after_its_scaling_method() -> None:
    """The run-time option's variant: its tag in a results table, the method's name, and the spelled-out none."""
    assert positional.variant_tags({"rope_scaling": example("yarn", 1.0)}) == ("yarn",)
    assert positional.variant_tags({"rope_scaling": {"rope_type": "default"}}) == ()
    assert positional.variant_tags({"rope_scaling": None}) == positional.variant_tags({}) == ()
    assert positional.variant_names()["linear"] == "PI" and positional.variant_names()["yarn"] == "YaRN"
    assert positional.unset_value("rope_scaling", {"rope_type": "default"}) is None
    assert positional.unset_value("rope_scaling", example("linear", 1.0)) == example("linear", 1.0)


@pytest.mark.parametrize(
    ("rope_scaling", "message"),
    [
        ({"rope_type": "yarn", "fator": 4}, "unknown key(s) 'fator' in rope_scaling; did you mean 'factor'"),
        ({"rope_type": "yam", "factor": 4}, "rope_scaling needs rope_type: one of default, linear, dynamic, yarn"),
        ({"factor": 4}, "got no rope_type"),
        ({"rope_type": "linear"}, "rope_scaling with rope_type 'linear' needs factor"),
        ({"rope_type": "linear", "factor": 0.5}, "rope_scaling.factor must be at least 1 (1: no extension), got 0.5"),
        ({"rope_type": "linear", "factor": "4x"}, "rope_scaling.factor must be a number, got '4x'"),
        ({"rope_type": "linear", "factor": 4, "beta_fast": 8}, "rope_type 'linear' takes no beta_fast"),
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32.5},
         "rope_scaling.original_max_position_embeddings must be an integer, got 32.5"),
        ({"rope_type": "linear", "factor": 4, "rope_theta": 500.0}, "rope_scaling.rope_theta is kerple's rotary_emb_base"),
        ({"rope_type": "longrope", "factor": 4, "original_max_position_embeddings": 32, "short_factor": [1.0],
          "long_factor": [1.0] * 8}, "rope_scaling.short_factor must have length 8 (one per rotary frequency"),
        ({"rope_type": "llama3", "factor": 4, "original_max_position_embeddings": 32, "low_freq_factor": 4,
          "high_freq_factor": 1}, "rope_scaling.high_freq_factor (1) must be above low_freq_factor (4)"),
        # values transformers' validator lets through, and its initialisers divide by or take the log of
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 0},
         "rope_scaling.original_max_position_embeddings must be at least 1 (the length trained at), got 0"),
        ({"rope_type": "llama3", "factor": 4, "original_max_position_embeddings": -32, "low_freq_factor": 1,
          "high_freq_factor": 4}, "rope_scaling.original_max_position_embeddings must be at least 1"),
        ({"rope_type": "linear", "factor": math.inf}, "rope_scaling.factor must be finite, got inf"),
        ({"rope_type": "dynamic", "factor": math.nan}, "rope_scaling.factor must be finite, got nan"),
        ({"rope_type": "linear", "factor": 1e300}, "rope_scaling gives 8 of 8 rotary frequencies 0 or not finite"),
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32, "beta_slow": -1},
         "rope_scaling.beta_slow must be above 0, got -1"),
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32, "beta_fast": 2, "beta_slow": 4},
         "rope_scaling.beta_fast (2) must be at least beta_slow (4)"),
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32, "attention_factor": 0.0},
         "rope_scaling.attention_factor must be above 0, got 0.0"),
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32, "mscale": 1, "mscale_all_dim": 0},
         "rope_scaling.mscale_all_dim must be above 0, got 0"),
        ({"rope_type": "llama3", "factor": 4, "original_max_position_embeddings": 32, "low_freq_factor": 0,
          "high_freq_factor": 4}, "rope_scaling.low_freq_factor must be above 0, got 0"),
        ({"rope_type": "longrope", "factor": 4, "original_max_position_embeddings": 32, "short_factor": [1.0] * 8,
          "long_factor": [0.0] * 8}, "rope_scaling.long_factor must hold numbers above 0, got 0.0"),
        ({"rope_type": "longrope", "factor": 4, "original_max_position_embeddings": 32, "short_factor": [1.0] * 8,
          "long_factor": [1.0, math.inf] + [1.0] * 6}, "rope_scaling.long_factor must be finite"),
        ({"rope_type": "longrope", "original_max_position_embeddings": 32, "short_factor": [1.0] * 8,
          "long_factor": [1.0] * 8}, "rope_scaling with rope_type 'longrope' needs factor"),
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32, "truncate": "yes"},
         "rope_scaling.truncate must be true or false, got 'yes'"),
    ],
)
def test_bad_parameters_are_refused_naming_the_key(rope_scaling: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], {"pos_emb": "rotary", "hidden_size": 32, "num_attention_heads": 2, "rope_scaling": rope_scaling})
    assert info.value.key == "rope_scaling" and message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("pos_emb", "rope_scaling", "message"), [
    ("kerple_log", {"rope_type": "linear", "factor": 2}, "is an option of rotary, xpos; pos_emb 'kerple_log' does not take it"),
    ("xpos", {"rope_type": "proportional"}, "xpos's decay covers the rotary_pct channels only"),
])
def test_embeddings_without_the_scaling_refuse_it(pos_emb: str, rope_scaling: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config([], {"pos_emb": pos_emb, "hidden_size": 32, "num_attention_heads": 2, "rope_scaling": rope_scaling})


def tiny(pos_emb: str, rope_scaling: dict | None, impl: str = "eager") -> torch.nn.Module:
    cfg = load_config([], {"pos_emb": pos_emb, "hidden_size": 32, "num_attention_heads": 2, "num_layers": 2,
                           "vocab_size": 64, "make_vocab_size_divisible_by": 8, "seq_length": 8,
                           "attention_impl": impl, "train_iters": 0, "rope_scaling": rope_scaling})
    torch.manual_seed(0)
    model = build_model(cfg, flex_compile=False).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # weights far from the initialisation, so attention depends on positions
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


def scaling_beyond(rope_type: str, original: int = 8) -> dict:
    """``example`` with the original length of :func:`tiny`'s model (8), so 30 tokens are scaled."""
    rope_scaling = example(rope_type, 1.0)
    if "original_max_position_embeddings" in rope_scaling:
        rope_scaling["original_max_position_embeddings"] = original
    if rope_type == "longrope":
        rope_scaling["short_factor"], rope_scaling["long_factor"] = [1.0] * 8, [float(i + 1) for i in range(8)]
    return rope_scaling


@pytest.mark.parametrize("pos_emb", ["rotary", "xpos"])
@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope"])
def test_every_kernel_sees_the_scaling(pos_emb: str, rope_type: str, one_thread) -> None:
    """eager, sdpa and flex give the same logits with the scaling, and it changes the model beyond the
    original length."""
    tokens = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = {impl: tiny(pos_emb, scaling_beyond(rope_type), impl)(tokens) for impl in ("eager", "sdpa", "flex")}
        torch.testing.assert_close(logits["sdpa"], logits["eager"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits["flex"], logits["eager"], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(logits["eager"], tiny(pos_emb, None)(tokens), atol=1e-3)


@pytest.mark.parametrize("rope_type", ["linear", "yarn", "llama3"])
def test_decoding_through_the_kv_cache_equals_the_full_forward(rope_type: str, one_thread) -> None:
    """Fixed frequencies: a prompt then one token at a time through the cache gives the full forward's rows.
    (The length-dependent types rotate each new token at its own length, as transformers does: the
    Hugging Face export test compares that decoding with transformers' own.)"""
    model = tiny("rotary", scaling_beyond(rope_type))
    tokens = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        rows = [model(tokens[:, :20], cache=cache)]
        rows += [model(tokens[:, position : position + 1], cache=cache) for position in range(20, 30)]
    torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=1e-5, atol=1e-5)


def test_the_export_carries_rope_scaling_and_imports_it_back(tmp_path) -> None:
    """A stock GPTNeoX folder's config holds the scaling as transformers 5 (rope_parameters) and 4
    (rope_scaling) read it; a folder without kerple's own record imports it from those fields; and
    KerpleForCausalLM, whose rotary form takes fixed frequencies, is refused. (Logits and generation
    against transformers: tests/unit/checkpoint/test_hf_remote_code.py.)"""
    import json

    from kerple.checkpoint.errors import CheckpointError
    from kerple.checkpoint.huggingface import export_huggingface, import_huggingface

    yarn = example("yarn", 1.0)
    model = tiny("rotary", yarn)
    cfg = load_config([], {"pos_emb": "rotary", "hidden_size": 32, "num_attention_heads": 2, "num_layers": 2,
                           "vocab_size": 64, "make_vocab_size_divisible_by": 8, "seq_length": 8, "rope_scaling": yarn})
    flat = {**cfg.to_dict(), "padded_vocab_size": cfg.model.padded_vocab_size}
    folder = export_huggingface(model.state_dict(), flat, tmp_path / "hf")
    hf = json.loads((folder / "config.json").read_text())
    assert hf["rope_scaling"] == yarn
    assert hf["rope_parameters"] == {**yarn, "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
    del hf["kerple"]
    (folder / "config.json").write_text(json.dumps(hf))
    assert import_huggingface(folder)[1]["rope_scaling"] == yarn
    with pytest.raises(CheckpointError) as refused:
        export_huggingface(model.state_dict(), flat, tmp_path / "kerple", target="kerple")
    assert "cannot be exported as KerpleForCausalLM: its rotary form takes fixed frequencies" in str(refused.value)
    assert "leave out --hf-target kerple" in str(refused.value) and "do not fit" not in str(refused.value)


def test_a_scaled_xpos_model_is_refused_with_the_way_to_export_it(tmp_path) -> None:
    """xPos exports as KerpleForCausalLM only, whose forms take fixed frequencies: the refusal says to
    export the weights without the run-time scaling (and never that the weights do not fit)."""
    from kerple.checkpoint.errors import CheckpointError
    from kerple.checkpoint.huggingface import export_huggingface

    keys = {"pos_emb": "xpos", "hidden_size": 32, "num_attention_heads": 2, "num_layers": 2, "vocab_size": 64,
            "make_vocab_size_divisible_by": 8, "seq_length": 8, "rope_scaling": example("linear", 1.0)}
    cfg = load_config([], keys)
    flat = {**cfg.to_dict(), "padded_vocab_size": cfg.model.padded_vocab_size}
    with pytest.raises(CheckpointError) as refused:
        export_huggingface(build_model(cfg, flex_compile=False).state_dict(), flat, tmp_path / "hf")
    assert "export the weights without the scaling (--config 'rope_scaling=null')" in str(refused.value)
    assert "do not fit" not in str(refused.value) and not (tmp_path / "hf").exists()


def test_a_checkpoint_does_not_bind_the_scaling() -> None:
    """Zero-shot extension of a fine-tuned run with another scaling: the recorded rope_scaling is not an
    architecture field (the shapes and the other options still are)."""
    from kerple.checkpoint.architecture import ArchitectureMismatchError, check_architecture

    cfg = load_config([], {"pos_emb": "rotary", "hidden_size": 32, "num_attention_heads": 2, "rope_scaling": example("linear", 1.0)})
    check_architecture({"pos_emb": "rotary", "rope_scaling": example("yarn", 1.0)}, cfg, "ckpt")
    with pytest.raises(ArchitectureMismatchError, match="rotary_emb_base"):
        check_architecture({"pos_emb": "rotary", "rotary_emb_base": 500.0}, cfg, "ckpt")
