"""``generate.py`` end to end on a tiny checkpoint (character-level tokenizer, no downloads)."""

from __future__ import annotations

import pytest
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


def tiny_checkpoint(tmp_path, **extra):
    """A 2-layer character-level checkpoint written with its config under ``configs/``; (yml, dir)."""
    values = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 512, "seq_length": 64,
              "pos_emb": "kerple_log", "tokenizer_type": "CharLevelTokenizer", "attention_impl": "eager", **extra}
    config_file = tmp_path / "tiny.yml"
    config_file.write_text(yaml.safe_dump(values))
    model = build_model(load_config([str(config_file)]), flex_compile=False)
    state = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    args = {"num_attention_heads": 4, "pos_emb": "kerple_log", "num_layers": 2, "hidden_size": 32}
    write_checkpoint(tmp_path / "ckpt", state, iteration=7, args=args, config_files={"tiny.yml": config_file.read_text()})
    return config_file, tmp_path / "ckpt"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-new-tokens", "0"], "--max-new-tokens 0"),
        (["--max-new-tokens", "-3"], "--max-new-tokens -3"),
        (["--temperature", "-0.5"], "--temperature -0.5"),
        (["--temperature", "nan"], "--temperature nan"),
        (["--top-p", "0"], "--top-p 0.0"),
        (["--top-p", "1.5"], "--top-p 1.5"),
        (["--top-k", "-1"], "--top-k -1"),
        (["--temperature", "inf"], "--temperature inf"),
        (["--max-new-tokens", "100000000"], "--max-new-tokens 100000000: expected an integer from 1 to 65,536"),
    ],
)
def test_generate_refuses_meaningless_sampling_flags(tmp_path, capsys, flags, message):
    # No checkpoint is read: the flags are checked first.
    argv = ["--load", str(tmp_path / "none"), "--prompt", "x", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "expected" in err and "Traceback" not in err


@pytest.mark.parametrize("flags", [["--top-k", "5"], ["--top-p", "0.9"], ["--top-k", "5", "--temperature", "0"]])
def test_generate_refuses_sampling_flags_with_greedy_decoding(tmp_path, capsys, flags):
    """Greedy decoding (temperature 0, the default) takes the argmax: --top-k/--top-p would be ignored."""
    assert main(["--load", str(tmp_path / "none"), "--prompt", "x", *flags]) == 2
    err = capsys.readouterr().err
    assert f"{flags[0]} shape sampling, and --temperature 0 (the default) decodes greedily" in err
    assert err.count("\n") == 1


def test_generate_reads_the_checkpoint_configs_and_names_the_iteration(tmp_path, capsys):
    config_file, checkpoint = tiny_checkpoint(tmp_path)
    prompt = ["--prompt", "kernel", "--max-new-tokens", "5"]
    assert main([str(config_file), "--load", str(checkpoint), *prompt]) == 0
    with_yaml = capsys.readouterr()
    assert main(["--load", str(checkpoint), *prompt]) == 0
    without = capsys.readouterr()
    assert without.out == with_yaml.out and "tiny.yml (from the checkpoint)" in without.err
    assert f"loaded {checkpoint} at iteration 7" in with_yaml.err


def test_generate_reports_a_bad_tokenizer_before_loading_weights(tmp_path, capsys):
    config_file, checkpoint = tiny_checkpoint(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(b"\xff\xfe not json")
    # The checkpoint folder is missing: a tokenizer error proves the tokenizer was built first.
    argv = [str(config_file), "tokenizer_type=HFTokenizer", f"vocab_file={bad}", "--load", str(tmp_path / "none"),
            "--prompt", "x"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
    assert main([*argv[:-4], "--load", str(checkpoint), "--prompt", "x"]) == 2


def test_generate_writes_each_token_as_it_comes_and_ends_the_line(tmp_path, capsys):
    import io

    from kerple.inference.generate import build_parser, run

    class Writes(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.pieces: list[str] = []

        def write(self, text: str) -> int:
            self.pieces.append(text)
            return super().write(text)

    config_file, checkpoint = tiny_checkpoint(tmp_path)
    stream = Writes()
    args = build_parser().parse_intermixed_args(["--load", str(checkpoint), "--prompt", "kernel",
                                                 "--max-new-tokens", "12"])
    text = run(args, stream=stream)
    assert stream.getvalue() == text + "\n"
    assert stream.pieces[0] == "kernel" and len([piece for piece in stream.pieces if piece]) == 1 + 12 + 1
    assert main(["--load", str(checkpoint), "--prompt", "kernel", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_generate_warns_when_the_yaml_names_another_tokenizer_than_the_checkpoint(tmp_path, capsys):
    from kerple.data.tokenizers import train_bpe_tokenizer

    config_file, checkpoint = tiny_checkpoint(tmp_path)
    bpe = tmp_path / "bpe.json"
    train_bpe_tokenizer(["def kernel(x): return x\n"] * 20, 300, bpe)
    argv = [str(config_file), "tokenizer_type=HFTokenizer", f"vocab_file={bpe}", "--load", str(checkpoint),
            "--prompt", "kernel", "--max-new-tokens", "2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "generate.py: warning: tokenizer_type HFTokenizer (<command line>) is not the checkpoint's " \
           "CharLevelTokenizer" in err
    assert main([str(config_file), "--load", str(checkpoint), "--prompt", "kernel", "--max-new-tokens", "2"]) == 0
    assert "warning" not in capsys.readouterr().err
