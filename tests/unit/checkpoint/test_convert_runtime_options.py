"""Conversions with run-time options: ``--config key=value`` alone overrides the checkpoint's own config;
a scaled export loads in stock transformers without a word; ``--hf-target kerple`` on a scaled rotary run
says why and what to do (never that the weights do not fit); an export imported back keeps its step."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from ckpt_helpers import reference_tensors, write_reference_checkpoint
from kerple.checkpoint.convert import main as convert_main

LLAMA3 = "rope_scaling={rope_type: llama3, factor: 4, original_max_position_embeddings: 48, low_freq_factor: 1, high_freq_factor: 4}"


@pytest.fixture
def rotary_run(tmp_path: Path) -> Path:
    """A reference-layout rotary checkpoint at step 50 whose configs/ name the embedding (seq_length 48)."""
    return write_reference_checkpoint(tmp_path / "ref", reference_tensors("rotary"), pos_emb="rotary")


def rope_warnings(action) -> list[str]:
    """The messages transformers' RoPE validation logs while ``action()`` runs."""
    from transformers.utils import logging as hf_logging

    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    rope_logger = logging.getLogger("transformers.modeling_rope_utils")
    rope_logger.addHandler(handler)
    hf_logging.warning_once.cache_clear()
    try:
        action()
    finally:
        rope_logger.removeHandler(handler)
    return messages


def test_a_zero_shot_scaling_exports_from_the_checkpoints_own_config(rotary_run: Path, tmp_path: Path, capsys) -> None:
    """Overrides alone start from the checkpoint's config (rotary here), not from the defaults (learned)."""
    from transformers import AutoModelForCausalLM

    assert convert_main([str(rotary_run), str(tmp_path / "hf"), "--to", "hf", "--config", LLAMA3]) == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "gpt_neox" and config["rope_scaling"]["rope_type"] == "llama3"
    assert config["rope_scaling"]["original_max_position_embeddings"] < config["max_position_embeddings"]
    assert rope_warnings(lambda: AutoModelForCausalLM.from_pretrained(tmp_path / "hf")) == []


def test_an_override_of_the_architecture_is_still_checked(rotary_run: Path, tmp_path: Path, capsys) -> None:
    assert convert_main([str(rotary_run), str(tmp_path / "hf"), "--to", "hf", "--config", "hidden_size=64"]) == 2
    assert "hidden_size: checkpoint 32 vs config 64" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_kerple_target_of_a_scaled_rotary_run_names_the_way(rotary_run: Path, tmp_path: Path, capsys) -> None:
    code = convert_main([str(rotary_run), str(tmp_path / "hf"), "--to", "hf", "--hf-target", "kerple", "--config", LLAMA3])
    error = capsys.readouterr().err
    assert code == 2 and "do not fit" not in error and "leave out --hf-target kerple" in error
    assert error.count("\n") == 1 and not (tmp_path / "hf").exists()


def test_an_export_imported_back_keeps_its_step(rotary_run: Path, tmp_path: Path) -> None:
    """The export records the step of its weights; importing it back writes that step, not global_step0."""
    assert convert_main([str(rotary_run), str(tmp_path / "hf"), "--to", "hf"]) == 0
    assert convert_main([str(tmp_path / "hf"), str(tmp_path / "back"), "--to", "kerple"]) == 0
    assert (tmp_path / "back" / "latest").read_text().strip() == "global_step50"
    assert convert_main([str(tmp_path / "hf"), str(tmp_path / "at7"), "--to", "kerple", "--iteration", "7"]) == 0
    assert (tmp_path / "at7" / "latest").read_text().strip() == "global_step7"
    original = torch.load(rotary_run / "global_step50" / "layer_02-model_00-model_states.pt", weights_only=True)
    back = torch.load(tmp_path / "back" / "global_step50" / "layer_02-model_00-model_states.pt", weights_only=True)
    assert torch.equal(back["attention.dense.weight"], original["attention.dense.weight"])


def test_a_windowed_run_converts_with_its_window(tmp_path: Path) -> None:
    """The attention window (a run-time option) is carried into the converted config and the export."""
    source = write_reference_checkpoint(tmp_path / "ref", reference_tensors("alibi"), pos_emb="alibi",
                                        args_overrides={"attention_window": 16})
    assert convert_main([str(source), str(tmp_path / "hf"), "--to", "hf"]) == 0
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["attention_window"] == 16 and exported["kerple"]["config"]["attention_window"] == 16
