"""``generate.py`` end to end on a tiny checkpoint (character-level tokenizer, no downloads)."""

from __future__ import annotations

import yaml

from kerple.checkpoint import NeoxAdapter, write_checkpoint
from kerple.config import load_config
from kerple.inference.generate import main
from kerple.model import build_model


def test_generate_command_line_continues_the_prompt(tmp_path, capsys):
    values = {
        "num_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "vocab_size": 512,
        "seq_length": 64,
        "pos_emb": "kerple_log",
        "tokenizer_type": "CharLevelTokenizer",
        "attention_impl": "eager",
    }
    config_file = tmp_path / "tiny.yml"
    config_file.write_text(yaml.safe_dump(values))
    cfg = load_config([str(config_file)])
    model = build_model(cfg, flex_compile=False)
    args = {"num_attention_heads": 4, "pos_emb": "kerple_log", "num_layers": 2, "hidden_size": 32}
    state = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    write_checkpoint(tmp_path / "ckpt", state, iteration=3, args=args)
    argv = [str(config_file), "--load", str(tmp_path / "ckpt"), "--prompt", "kernel", "--max-new-tokens", "12"]
    assert main(argv + ["--cache-window", "8"]) == 0
    windowed = capsys.readouterr().out.rstrip("\n")
    assert windowed.startswith("kernel") and len(windowed) == len("kernel") + 12
    assert main(argv + ["--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "3"]) == 0
    sampled = capsys.readouterr().out
    assert main(argv + ["--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "3"]) == 0
    assert capsys.readouterr().out == sampled  # seeded sampling is reproducible


def test_generate_reports_a_missing_checkpoint(tmp_path, capsys):
    config_file = tmp_path / "tiny.yml"
    config_file.write_text(yaml.safe_dump({"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                                           "vocab_size": 512, "tokenizer_type": "CharLevelTokenizer"}))
    assert main([str(config_file), "--load", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
