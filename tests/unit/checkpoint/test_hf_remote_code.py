"""Every embedding of the registry exports to a Hugging Face folder that computes kerple's function.

The contract: for every registry entry (and a few model variants), the folder written by
:func:`export_huggingface` loads with ``AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)`` in an interpreter where kerple cannot be imported
(``hf_without_kerple.py``), gives kerple's own logits (fp32, within 1e-5), and generates greedily
the same tokens as kerple's ``generate`` (with and without the KV cache, and left-padded in a
batch). The folder ``save_pretrained`` writes back imports into kerple bit for bit. One subprocess
serves all cases: its start-up (importing torch and transformers) is most of the cost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_helpers import VOCAB, state_dicts_equal, tiny_config, tiny_model
from kerple import positional
from kerple.checkpoint.huggingface import describe_export, export_huggingface, import_huggingface, target_for
from kerple.inference.generate import generate

REPO = Path(__file__).resolve().parents[3]
NEW_TOKENS = 10
# case -> (config overrides, export target); every registry entry with its default target, the
# stock-mapped ones through KerpleForCausalLM as well, and the other norms, activations, residual,
# tying and the attention window
CASES: dict[str, tuple[dict, str | None]] = {
    **{name: ({"pos_emb": name}, None) for name in positional.names()},
    **{f"{name}_as_kerple": ({"pos_emb": name}, "kerple") for name in ("none", "rotary", "learned")},
    "rotary_half_gptj": ({"pos_emb": "rotary", "rotary_pct": 0.5, "gpt_j_residual": True}, None),
    "learned_gptj": ({"pos_emb": "learned", "gpt_j_residual": True}, None),
    "kerple_log_rmsnorm_swish_gptj_tied": (
        {"pos_emb": "kerple_log", "norm": "rmsnorm", "activation": "swish", "gpt_j_residual": True, "no_weight_tying": False},
        None,
    ),
    "alibi_scalenorm_mish_window": ({"pos_emb": "alibi", "norm": "scalenorm", "activation": "mish", "attention_window": 5}, None),
    "rotary_relu_window": ({"pos_emb": "rotary", "activation": "relu", "attention_window": 7}, None),
    "sandwich_softsign": ({"pos_emb": "sandwich", "activation": "softsign", "sandwich_dim": 16}, None),
    "alibi_shifted": ({"pos_emb": "alibi", "alibi_slope_shift": 2.0}, None),
    # FIRE's threshold below the tokens' positions, so its normaliser ψ(max(i, L)) reads the position ids
    "fire_short_threshold": ({"pos_emb": "fire", "fire_init_threshold": 3.0}, None),
    # RoPE context extension (docs/context-extension.md): every rope_type of transformers, the original
    # length (8) below the 20 tokens and the 16 positions generation reaches
    **{f"rotary_{name}": ({"pos_emb": "rotary", "max_position_embeddings": 8, **extra, "rope_scaling": scaling}, None)
       for name, extra, scaling in (
           ("pi", {}, {"rope_type": "linear", "factor": 4.0}),
           ("dynamic_ntk", {}, {"rope_type": "dynamic", "factor": 4.0}),
           ("yarn", {}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
           ("yarn_half", {"rotary_pct": 0.5}, {"rope_type": "yarn", "factor": 2.5, "original_max_position_embeddings": 8,
                                               "beta_fast": 8, "beta_slow": 2}),
           ("llama3", {}, {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 8,
                           "low_freq_factor": 1.0, "high_freq_factor": 2.0}),
           ("longrope", {}, {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 8,
                             "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0]}),
           ("proportional_half", {"rotary_pct": 0.5}, {"rope_type": "proportional"}),
       )},
}
# transformers computes these frequencies from the batch's largest position and at every decoding step,
# so a left-padded row is not decoded as alone, and generation without a cache re-rotates the past keys
LENGTH_DEPENDENT_CASES = ("rotary_dynamic_ntk", "rotary_longrope")
STOCK_CLASSES = {"gpt_neox": "GPTNeoXForCausalLM", "gpt2": "GPT2LMHeadModel", "kerple": "KerpleForCausalLM"}


def _perturbed_model(overrides: dict) -> torch.nn.Module:
    """A tiny model whose every weight is moved off its initialisation (norm gains from 1, biases from 0)."""
    torch.manual_seed(11)
    model = tiny_model(**overrides)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.2)
    return model


def _greedy_without_cache(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding that runs the whole sequence at every step, as ``generate(use_cache=False)``."""
    tokens = prompt
    for _ in range(new_tokens):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


def _flat(cfg) -> dict:
    flat = cfg.to_dict()
    flat["padded_vocab_size"] = cfg.model.padded_vocab_size
    return flat


def _run_without_kerple(work: Path) -> subprocess.CompletedProcess:
    """``hf_without_kerple.py`` in a fresh ``python -I`` from ``work``, with its own Hugging Face home."""
    shutil.copyfile(Path(__file__).with_name("hf_without_kerple.py"), work / "hf_without_kerple.py")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "HF_"))}
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env["OMP_NUM_THREADS"] = "1"  # tiny tensors: see the one_thread fixture (tests/conftest.py)
    command = [sys.executable, "-I", "hf_without_kerple.py", str(work), str(REPO)]
    return subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)


def test_every_registry_embedding_loads_without_kerple_and_matches_it(tmp_path, one_thread):
    work = tmp_path / "work"
    (work / "folders").mkdir(parents=True)
    tokens = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(2))
    prompt = tokens[:, :6]
    torch.save({"tokens": tokens, "prompt": prompt, "new_tokens": NEW_TOKENS}, work / "inputs.pt")
    expected, models = {}, {}
    for case, (overrides, target) in CASES.items():
        cfg = tiny_config(**overrides)
        model = _perturbed_model(overrides)
        export_huggingface(model.state_dict(), _flat(cfg), work / "folders" / case, target=target)
        with torch.no_grad():
            expected[case] = {
                "class": STOCK_CLASSES[target or target_for(_flat(cfg))],
                "logits": model(tokens),
                "greedy": generate(model, prompt, NEW_TOKENS),
                "short": generate(model, prompt[1:, 2:], NEW_TOKENS),
                "short_logits": model(prompt[1:, 2:]),
            }
            if case in LENGTH_DEPENDENT_CASES:
                expected[case]["greedy_no_cache"] = _greedy_without_cache(model, prompt, NEW_TOKENS)
        models[case] = model
    result = _run_without_kerple(work)
    assert result.returncode == 0, result.stderr[-4000:]
    actual = torch.load(work / "actual.pt", weights_only=True)
    problems = []
    for case, want in expected.items():
        got = actual[case]
        if got["class"] != want["class"]:
            problems.append(f"{case}: loaded as {got['class']}, expected {want['class']}")
        difference = (got["logits"] - want["logits"]).abs().max().item()
        if difference > 1e-5:
            problems.append(f"{case}: logits differ by {difference:.3g}")
        for run in ("greedy", "greedy_no_cache"):
            reference = want.get(run, want["greedy"])
            if not torch.equal(got[run], reference):
                problems.append(f"{case}: {run} {got[run].tolist()} vs kerple {reference.tolist()}")
        if case in LENGTH_DEPENDENT_CASES:
            continue
        padded_difference = (got["padded_logits"][1, 2:] - want["short_logits"][0]).abs().max().item()
        if padded_difference > 1e-5:
            problems.append(f"{case}: the left-padded row's logits differ by {padded_difference:.3g}")
        if not torch.equal(got["padded"][0], want["greedy"][0]) or not torch.equal(got["padded"][1, 2:], want["short"][0]):
            problems.append(f"{case}: left-padded batch {got['padded'].tolist()} vs kerple {want['greedy'][0].tolist()}, {want['short'][0].tolist()}")
        state, _ = import_huggingface(work / "resaved" / case)
        if state_dicts_equal(state, models[case].state_dict()):
            problems.append(f"{case}: save_pretrained's folder imports with other tensors: {state_dicts_equal(state, models[case].state_dict())}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("pos_emb", positional.names())
def test_export_import_round_trip_is_bit_exact(tmp_path, pos_emb, one_thread):
    cfg = tiny_config(pos_emb)
    model = _perturbed_model({"pos_emb": pos_emb})
    folder = export_huggingface(model.state_dict(), _flat(cfg), tmp_path / "hf", target="kerple")
    state, config = import_huggingface(folder)
    assert state_dicts_equal(state, model.state_dict()) == []
    assert config == {key: value for key, value in _flat(cfg).items() if key != "padded_vocab_size"}
    again = tiny_model(pos_emb)
    again.load_state_dict(state, strict=True)
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(again(tokens), model(tokens))


def test_kerple_folder_describes_the_embedding_as_data(tmp_path):
    """config.json names where each term acts, its form and its stored tensors; the code is in the folder."""
    cfg = tiny_config("kerple_bias_wht")
    folder = export_huggingface(_perturbed_model({"pos_emb": "kerple_bias_wht"}).state_dict(), _flat(cfg), tmp_path / "hf")
    hf = json.loads((folder / "config.json").read_text())
    assert hf["auto_map"]["AutoModelForCausalLM"] == "modeling_kerple.KerpleForCausalLM"
    assert (folder / "modeling_kerple.py").is_file() and (folder / "configuration_kerple.py").is_file()
    terms = hf["positional"]
    assert terms["bias"] == {"form": "power", "a": {"tensor": "bias_a", "min": 0.01}, "p": {"tensor": "bias_p", "min": 0.01, "max": 2.0}}
    assert terms["weight"]["form"] == "exp" and terms["weight"]["a"] == {"tensor": "wei_a", "min": 0.01}
    assert terms["tensors"]["wei_p"] == {"shape": [4, 1, 1], "trainable": True}
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        assert "gpt_neox.positional.wei_a" in set(weights.keys())


def test_export_log_names_the_class_and_why():
    flat = _flat(tiny_config("alibi"))
    assert "KerpleForCausalLM" in describe_export(flat) and "BLOOM" in describe_export(flat)
    assert "stock transformers GPTNeoXForCausalLM" in describe_export(_flat(tiny_config("rotary")))
    assert "computes the same function" in describe_export(_flat(tiny_config("learned")), "kerple")


@pytest.mark.parametrize(
    "pos_emb, first_format_key, key",
    [("kerple_log", "attention.rpe.bias_p", "bias_p"), ("learned", "embedding.position_embeddings.weight", "position_embeddings.weight")],
)
def test_first_format_folders_still_import(tmp_path, pos_emb, first_format_key, key):
    """Before KerpleForCausalLM, the positional tensors were named kerple_positional.<GPT-NeoX key>."""
    from safetensors.torch import load_file, save_file

    model = _perturbed_model({"pos_emb": pos_emb})
    folder = export_huggingface(model.state_dict(), _flat(tiny_config(pos_emb)), tmp_path / "hf", target="kerple")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["kerple_positional." + first_format_key] = tensors.pop("gpt_neox.positional." + key)
    save_file(tensors, str(folder / "model.safetensors"))
    state, _ = import_huggingface(folder)
    assert state_dicts_equal(state, model.state_dict()) == []
