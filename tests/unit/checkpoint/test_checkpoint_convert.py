"""Conversions are lossless; Hugging Face exports load in transformers with the same logits."""

from __future__ import annotations

import pytest
import torch

from ckpt_helpers import (
    VOCAB,
    full_state,
    load_reference,
    reference_shard,
    reference_tensors,
    state_dicts_equal,
    tiny_config,
    tiny_model,
    write_reference_checkpoint,
)
from kerple.checkpoint import load_model_weights, read_checkpoint
from kerple.checkpoint.convert import main as convert_main
from kerple.checkpoint.huggingface import export_huggingface, import_huggingface, target_for

TOKENS = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(2))


def _flat(cfg) -> dict:
    flat = cfg.to_dict()
    flat["padded_vocab_size"] = cfg.model.padded_vocab_size
    return flat


def test_reference_to_kerple_to_neox_round_trip_is_lossless(tmp_path):
    files = reference_tensors("kerple_log")
    original = full_state(files)
    source = write_reference_checkpoint(tmp_path / "ref", files, pos_emb="kerple_log", ranks=2)
    assert convert_main([str(source), str(tmp_path / "kerple"), "--to", "kerple"]) == 0
    kerple = read_checkpoint(tmp_path / "kerple")
    assert (kerple.model_parallel_size, kerple.is_kerple_format, kerple.pos_emb) == (1, True, "kerple_log")
    assert state_dicts_equal(kerple.state_dict, original) == []
    assert convert_main([str(tmp_path / "kerple"), str(tmp_path / "seq"), "--to", "neox", "--model-parallel", "2", "--layout", "sequential"]) == 0
    sequential = read_checkpoint(tmp_path / "seq")
    assert (sequential.layout, sequential.model_parallel_size) == ("sequential", 2)
    assert state_dicts_equal(sequential.state_dict, original) == []
    assert convert_main([str(tmp_path / "seq"), str(tmp_path / "pipe"), "--to", "neox", "--model-parallel", "2"]) == 0
    # the written shards are exactly the reference's own files
    for name in ("layer_02-model_01-model_states.pt", "layer_00-model_00-model_states.pt", "layer_06-model_01-model_states.pt"):
        ours = torch.load(tmp_path / "pipe" / "global_step50" / name, weights_only=True)
        theirs = torch.load(source / "global_step50" / name, weights_only=True)
        assert state_dicts_equal(ours, theirs) == [], name
    model = tiny_model("kerple_log")
    assert load_model_weights(model, tmp_path / "pipe", cfg=tiny_config("kerple_log")) == 50


def test_convert_with_a_wrong_config_names_the_fields(tmp_path, capsys):
    source = write_reference_checkpoint(tmp_path / "ref", reference_tensors("kerple_log"), pos_emb="kerple_log")
    code = convert_main([str(source), str(tmp_path / "out"), "--to", "kerple", "--config", "num_layers=3", "pos_emb=alibi",
                         "hidden_size=32", "num_attention_heads=4", "vocab_size=64", "make_vocab_size_divisible_by=8"])
    assert code == 2
    err = capsys.readouterr().err
    assert "num_layers: checkpoint 2 vs config 3" in err and "pos_emb: checkpoint 'kerple_log' vs config 'alibi'" in err
    assert not (tmp_path / "out").exists()


def test_converting_into_a_folder_with_a_later_step_is_refused(tmp_path, capsys):
    """The conversion pointed the folder's 'latest' at its older step: a resume from it rewound."""
    source = write_reference_checkpoint(tmp_path / "ref", reference_tensors("kerple_log"), pos_emb="kerple_log")
    out = tmp_path / "run"
    assert convert_main([str(source), str(out), "--to", "kerple"]) == 0
    (out / "global_step50").rename(out / "global_step60")  # the run went on to step 60
    (out / "latest").write_text("global_step60")
    capsys.readouterr()
    assert convert_main([str(source), str(out), "--to", "neox"]) == 2
    assert (f"convert_checkpoint.py: error: output {out} holds a later checkpoint (global_step60); writing step 50 "
            "there would point its 'latest' back") in capsys.readouterr().err
    assert (out / "latest").read_text() == "global_step60" and sorted(p.name for p in out.iterdir()) == ["global_step60", "latest"]


def test_resplit_to_more_ranks_than_heads_is_refused(tmp_path, capsys):
    source = write_reference_checkpoint(tmp_path / "ref", reference_tensors("rpe"), pos_emb="rpe")
    assert convert_main([str(source), str(tmp_path / "out"), "--to", "neox", "--model-parallel", "3"]) == 2
    assert "4 attention heads over model_parallel_size 3" in capsys.readouterr().err


@pytest.mark.parametrize("overrides", [{"rotary_pct": 0.5, "gpt_j_residual": True}, {"gpt_j_residual": False}])
def test_rotary_export_loads_in_transformers_gpt_neox(tmp_path, overrides):
    from transformers import GPTNeoXForCausalLM

    cfg = tiny_config("rotary", **overrides)
    model = tiny_model("rotary", **overrides)
    _perturb(model)
    assert target_for(_flat(cfg)) == "gpt_neox"
    folder = export_huggingface(model.state_dict(), _flat(cfg), tmp_path / "hf")
    hf = GPTNeoXForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(TOKENS).logits, model(TOKENS), rtol=1e-5, atol=1e-5)
    state, config = import_huggingface(folder)
    assert state_dicts_equal(state, model.state_dict()) == []
    assert config["rotary_pct"] == cfg.positional.rotary_pct


def test_learned_export_loads_in_transformers_gpt2(tmp_path):
    from transformers import GPT2LMHeadModel

    cfg = tiny_config("learned")
    model = tiny_model("learned")
    _perturb(model)
    folder = export_huggingface(model.state_dict(), _flat(cfg), tmp_path / "hf")
    hf = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(TOKENS).logits, model(TOKENS), rtol=1e-5, atol=1e-5)
    state, _ = import_huggingface(folder)
    assert state_dicts_equal(state, model.state_dict()) == []


@pytest.mark.parametrize("pos_emb", ["kerple_log", "alibi", "rpe", "sandwich", "fire", "cable", "xpos"])
def test_bias_embedding_export_round_trips_into_kerple(tmp_path, pos_emb):
    cfg = tiny_config(pos_emb)
    model = tiny_model(pos_emb)
    _perturb(model)
    folder = export_huggingface(model.state_dict(), _flat(cfg), tmp_path / "hf")
    state, config = import_huggingface(folder)
    assert config["pos_emb"] == pos_emb
    assert state_dicts_equal(state, model.state_dict()) == []
    if pos_emb == "kerple_log":  # the folder's own modeling code runs only when trusted
        from transformers import AutoModelForCausalLM

        with pytest.raises(ValueError, match="trust_remote_code"):
            AutoModelForCausalLM.from_pretrained(folder)
    # the HF folder converts back to a kerple checkpoint that loads with the same logits
    assert convert_main([str(folder), str(tmp_path / "back"), "--to", "kerple"]) == 0
    torch.manual_seed(123)
    again = tiny_model(pos_emb)  # fresh random weights, overwritten by the load
    load_model_weights(again, tmp_path / "back", cfg=cfg)
    with torch.no_grad():
        torch.testing.assert_close(again(TOKENS), model(TOKENS), rtol=0, atol=0)


def test_reference_checkpoint_to_hf_with_the_command_line(tmp_path):
    from transformers import GPTNeoXForCausalLM

    files = reference_tensors("rotary")
    source = write_reference_checkpoint(tmp_path / "ref", files, pos_emb="rotary", ranks=2)
    assert convert_main([str(source), str(tmp_path / "hf"), "--to", "hf"]) == 0
    hf = GPTNeoXForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    model = tiny_model("rotary")
    load_reference(model, files)
    with torch.no_grad():
        torch.testing.assert_close(hf(TOKENS).logits, model(TOKENS), rtol=1e-5, atol=1e-5)


def test_shard_helper_matches_reference_layout_for_the_head():
    """Sanity of the test's own writer: splitting and concatenating restores the tensor."""
    tensor = torch.randn(3 * 32, 32)
    pieces = [reference_shard("attention.query_key_value.weight", tensor, r, 2) for r in range(2)]
    assert torch.equal(torch.cat(pieces), tensor)


def _perturb(model) -> None:
    """Non-trivial norms and biases (the initialisation leaves them at 1 and 0)."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_a_neox_output_pads_its_tokenizer_to_its_rows(tmp_path, ranks):
    """The ``--to neox`` folder's configs/ rebuild a model of the checkpoint's vocabulary rows: GPT-NeoX
    pads the tokenizer's vocabulary to ``make_vocab_size_divisible_by x model_parallel_size``
    (docs/reference-format.md §4), so the written divisor, applied to the tokenizer, gives the rows."""
    import math

    import yaml
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from kerple.checkpoint.files import checkpoint_config_files
    from kerple.config import load_config

    tokenizer = tmp_path / "tokenizer.json"  # 60 ids, padded by 32 to the 64 rows of the tiny checkpoint
    Tokenizer(WordLevel({f"w{i}": i for i in range(59)} | {"<|endoftext|>": 59}, unk_token="w0")).save(str(tokenizer))
    recorded = {"tokenizer_type": "HFTokenizer", "vocab_file": str(tokenizer), "make_vocab_size_divisible_by": 32}
    source = write_reference_checkpoint(tmp_path / "ref", reference_tensors("kerple_log"), pos_emb="kerple_log",
                                        args_overrides=recorded)
    out = tmp_path / "neox"
    assert convert_main([str(source), str(out), "--to", "neox", "--model-parallel", str(ranks)]) == 0
    written = yaml.safe_load((out / "global_step50" / "configs" / "config.yml").read_text())
    divisor = written["make-vocab-size-divisible-by"]
    assert math.ceil(60 / (divisor * ranks)) * divisor * ranks == VOCAB  # GPT-NeoX's padding of the tokenizer
    assert divisor == (32 if ranks < 4 else VOCAB // ranks)  # the source's own where it still gives 64 rows
    args = torch.load(out / "global_step50" / "mp_rank_00_model_states.pt", weights_only=True)["args"]
    assert (args["make_vocab_size_divisible_by"], args["padded_vocab_size"]) == (divisor, VOCAB)
    cfg = load_config(checkpoint_config_files(out))  # what evaluate.py --load reads without YAML files
    assert cfg.model.padded_vocab_size == VOCAB and cfg.data.tokenizer_type == "HFTokenizer"
