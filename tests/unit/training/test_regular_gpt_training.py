"""RegularGPT through the real trainer: a few steps, a checkpoint, a load into a fresh model, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerple import checkpoint as ckpt
from kerple.config import ConfigError
from kerple.model import build_model
from kerple.model.regular import RegularGPT
from tiny_run import corpus, parallel, tiny_config, train

REGULAR = {"arch": "regulargpt", "pos_emb": "none", "regular_chunk_size": 4, "regular_thickness": 2}


def test_train_save_and_load_round_trip(parallel, corpus: Path, tmp_path: Path) -> None:
    save = tmp_path / "checkpoints"
    cfg = tiny_config(corpus, train_iters=4, lr_decay_iters=4, save=str(save), save_interval=4, **REGULAR)
    result = train(cfg, parallel)
    assert len(result.losses) == 4 and all(torch.isfinite(torch.tensor([loss for _, loss in result.losses])))
    meta = ckpt.safe_torch_load(save / "global_step4" / "mp_rank_00_model_states.pt")
    assert (meta["args"]["arch"], meta["args"]["regular_chunk_size"], meta["args"]["regular_thickness"]) == ("regulargpt", 4, 2)

    fresh = build_model(tiny_config(corpus, **REGULAR))
    assert isinstance(fresh, RegularGPT) and len(fresh.layers) == 2
    assert ckpt.load_model_weights(fresh, save) == 4
    trained_scalars = ckpt.safe_torch_load(save / "global_step4" / "layer_03-model_00-model_states.pt")
    # layer file 3 holds block 1 (GPT-NeoX's index 2 + k); the scalars left their zero initialisation
    assert torch.equal(fresh.layers[1].attention.relative_scalars, trained_scalars["attention.relative_scalars"])
    assert fresh.layers[1].attention.relative_scalars.abs().sum() > 0

    from kerple.checkpoint.convert import main as convert_main

    assert convert_main([str(save), str(tmp_path / "hf"), "--to", "hf"]) == 2  # no Hugging Face equivalent
    assert convert_main([str(save), str(tmp_path / "copy"), "--to", "kerple"]) == 0
    copied = build_model(tiny_config(corpus, **REGULAR))
    assert ckpt.load_model_weights(copied, tmp_path / "copy") == 4
    assert all(torch.equal(a, b) for a, b in zip(copied.state_dict().values(), fresh.state_dict().values()))

    other_chunk = tiny_config(corpus, **{**REGULAR, "regular_chunk_size": 2})
    with pytest.raises(ckpt.CheckpointError, match="regular_chunk_size"):
        ckpt.load_model_weights(build_model(other_chunk), save, cfg=other_chunk)


def test_config_refusals_name_the_key(corpus: Path) -> None:
    with pytest.raises(ConfigError, match="pos_emb"):
        tiny_config(corpus, **{**REGULAR, "pos_emb": "alibi"})
    with pytest.raises(ConfigError, match="regular_chunk_size"):
        tiny_config(corpus, **{**REGULAR, "regular_chunk_size": 1})
    with pytest.raises(ConfigError, match="attention_impl"):
        tiny_config(corpus, **{**REGULAR, "attention_impl": "sdpa"})
    with pytest.raises(ConfigError, match="model_parallel_size"):
        tiny_config(corpus, **{**REGULAR, "model_parallel_size": 2})


def test_generate_py_runs_without_a_cache(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import yaml

    from kerple.checkpoint import NeoxAdapter, write_checkpoint
    from kerple.config import load_config
    from kerple.inference.generate import main

    values = {**REGULAR, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 512, "seq_length": 64,
              "tokenizer_type": "CharLevelTokenizer"}
    config_file = tmp_path / "regular.yml"
    config_file.write_text(yaml.safe_dump(values))
    model = build_model(load_config([str(config_file)]), flex_compile=False)
    state = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    write_checkpoint(tmp_path / "ckpt", state, iteration=1, args={"num_attention_heads": 4, "pos_emb": "none"})
    argv = [str(config_file), "--load", str(tmp_path / "ckpt"), "--prompt", "regular", "--max-new-tokens", "5"]
    assert main(argv) == 0
    assert len(capsys.readouterr().out.rstrip("\n")) == len("regular") + 5
    assert main(argv + ["--cache-window", "8"]) == 2
    assert "no KV cache" in capsys.readouterr().err
