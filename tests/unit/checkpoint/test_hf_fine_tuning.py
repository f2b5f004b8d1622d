"""An exported ``KerpleForCausalLM`` folder as a transformers user fine-tuning it finds it: sdpa,
hidden states and attentions, ``return_dict=False``, activation checkpointing, a padding token, no
warning for inputs past the training length, and files everyone can read (hf_as_a_user.py runs the
user's side in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt_helpers import tiny_config, tiny_model
from kerple.checkpoint.huggingface import export_huggingface
from kerple.data.tokenizers import train_bpe_tokenizer

VOCAB = 320
CASES = {"kerple_log": "kerple_log", "alibi": "alibi", "kerple_wht": "kerple_wht", "cable": "cable"}


def _flat(cfg) -> dict:
    flat = cfg.to_dict()
    flat["padded_vocab_size"] = cfg.model.padded_vocab_size
    return flat


def _export(pos_emb: str, folder: Path, tokenizer: Path, **overrides: object) -> Path:
    torch.manual_seed(11)
    cfg = tiny_config(pos_emb, vocab_size=VOCAB, seq_length=16, **overrides)
    model = tiny_model(pos_emb, vocab_size=VOCAB, seq_length=16, **overrides)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(5)) * 0.2)
    return export_huggingface(model.state_dict(), _flat(cfg), folder, tokenizer_files=[tokenizer])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_bpe_tokenizer(["def kernel(x):\n    return x + 1\n", "x = 1\n" * 50] * 20, 300, path)
    return path


def test_a_fine_tuning_user_gets_what_transformers_models_give(tmp_path: Path, tokenizer: Path, one_thread) -> None:
    work = tmp_path / "work"
    for case, pos_emb in CASES.items():
        _export(pos_emb, work / "folders" / case, tokenizer)
    shutil.copyfile(Path(__file__).with_name("hf_as_a_user.py"), work / "hf_as_a_user.py")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "HF_"))}
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="warning", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-I", "hf_as_a_user.py", str(work)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((work / "results.json").read_text())
    for case, got in results.items():
        layers = got["layers"]
        assert got["default_implementation"] == "sdpa", case  # was refused: eager only
        assert got["sdpa_difference"] < 1e-5, (case, got["sdpa_difference"])
        assert got["hidden_states"] == layers + 1 and got["last_hidden_is_final"], case  # were None
        assert got["attentions"] == [[2, 4, 20, 20]] * layers and got["attention_rows_sum_to_one"], case
        assert got["sdpa_attentions"] == layers, case  # asked for: computed the eager way
        assert got["tuple"] == "tuple" and got["tuple_logits_equal"], case  # return_dict=False was ignored
        assert got["gradients"] and got["checkpointing_gradient_difference"] < 1e-6, (case, got)  # it raised
        assert got["padded_shape"][0] == 2, case  # no pad token: padding=True raised
        assert got["model_max_length"] > 10**20, case  # the training length: every longer input warned
        assert got["input_tokens"] > 16 and not [w for w in got["warnings"] if "maximum" in w or "indexing" in w], got
    assert results["kerple_log"]["positional_gradients"] == ["gpt_neox.positional.bias_a", "gpt_neox.positional.bias_p"]


def test_the_export_is_readable_like_any_new_folder(tmp_path: Path, tokenizer: Path) -> None:
    """The folder kept mkdtemp's 0700 and model.safetensors its 0600."""
    mask = os.umask(0o022)
    try:
        folder = _export("kerple_log", tmp_path / "hf", tokenizer)
    finally:
        os.umask(mask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir()} == {
        name: 0o644 for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                 "configuration_kerple.py", "modeling_kerple.py")}
    config = json.loads((folder / "config.json").read_text())
    assert config["max_position_embeddings"] is None and config["training_length"] == 16
    assert config["pad_token_id"] == config["eos_token_id"]
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert "model_max_length" not in tokenizer_config and tokenizer_config["pad_token"] == tokenizer_config["eos_token"]
    learned = _export("learned", tmp_path / "learned", tokenizer, max_position_embeddings=64)  # a table limits the input: said as it is
    assert json.loads((learned / "tokenizer_config.json").read_text())["model_max_length"] == 64
