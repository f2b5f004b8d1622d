"""Reading reference-layout checkpoints: layouts, model-parallel merge, shared copies, mismatches."""

from __future__ import annotations

import pytest
import torch

from ckpt_helpers import (
    HEADS,
    LAYERS,
    VOCAB,
    full_state,
    load_reference,
    reference_tensors,
    tiny_config,
    tiny_model,
    write_reference_checkpoint,
)
from kerple.checkpoint import (
    ArchitectureMismatchError,
    CheckpointError,
    ModelParallelError,
    load_model_weights,
    read_checkpoint,
)

TOKENS = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
CANONICAL = {"kerple_power_ap_": "kerple_power"}


def _native_logits(pos_emb: str, files) -> torch.Tensor:
    model = tiny_model(CANONICAL.get(pos_emb, pos_emb))
    load_reference(model, files)
    with torch.no_grad():
        return model(TOKENS)


@pytest.mark.parametrize("layout", ["pipeline", "sequential"])
@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("pos_emb", ["kerple_log", "rpe", "alibi"])
def test_reference_checkpoint_gives_native_logits(tmp_path, layout, ranks, pos_emb):
    files = reference_tensors(pos_emb)
    root = write_reference_checkpoint(tmp_path, files, pos_emb=pos_emb, ranks=ranks, layout=layout)
    cfg = tiny_config(pos_emb)
    model = tiny_model(pos_emb)
    iteration = load_model_weights(model, root, cfg=cfg)
    assert iteration == 50
    with torch.no_grad():
        logits = model(TOKENS)
    torch.testing.assert_close(logits, _native_logits(pos_emb, files), rtol=0, atol=0)


def test_reference_pos_emb_string_is_resolved_and_layout_reported(tmp_path):
    files = reference_tensors("kerple_power_ap_")
    root = write_reference_checkpoint(tmp_path, files, pos_emb="kerple_power_ap_", ranks=2)
    ckpt = read_checkpoint(root)
    assert (ckpt.pos_emb, ckpt.layout, ckpt.model_parallel_size, ckpt.num_layers) == ("kerple_power", "pipeline", 2, LAYERS)
    model = tiny_model("kerple_power")
    load_model_weights(model, root, cfg=tiny_config("kerple_power"))
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), _native_logits("kerple_power_ap_", files), rtol=0, atol=0)
    with pytest.raises(ArchitectureMismatchError, match="pos_emb: checkpoint 'kerple_power' vs config 'kerple_log'"):
        load_model_weights(tiny_model("kerple_log"), root, cfg=tiny_config("kerple_log"))


def test_merged_qkv_rows_follow_the_head_layout(tmp_path):
    """With MP 2 the merged QKV equals the original: ranks' rows concatenate in head order."""
    files = reference_tensors("kerple_log")
    root = write_reference_checkpoint(tmp_path, files, pos_emb="kerple_log", ranks=2)
    merged = read_checkpoint(root).state_dict
    for name, tensor in full_state(files).items():
        assert torch.equal(merged[name], tensor), name


def test_explicit_iteration_and_tag_directory(tmp_path):
    files = reference_tensors("kerple_log")
    root = write_reference_checkpoint(tmp_path, files, pos_emb="kerple_log")
    assert read_checkpoint(root, iteration=50).iteration == 50
    assert read_checkpoint(root / "global_step50").iteration == 50
    with pytest.raises(CheckpointError, match="global_step7"):
        read_checkpoint(root, iteration=7)


def test_disagreeing_positional_copies_name_the_layers(tmp_path):
    files = reference_tensors("kerple_log")
    files[LAYERS + 1]["attention.rpe.bias_p"] = files[LAYERS + 1]["attention.rpe.bias_p"] + 1.0
    root = write_reference_checkpoint(tmp_path, files, pos_emb="kerple_log")
    with pytest.raises(CheckpointError, match=r"attention\.rpe\.bias_p.*layer 2 and layer\(s\) \[3\]"):
        read_checkpoint(root)


def test_architecture_mismatch_names_every_field(tmp_path):
    root = write_reference_checkpoint(tmp_path, reference_tensors("kerple_log"), pos_emb="kerple_log")
    cfg = tiny_config("alibi", num_layers=3, hidden_size=64, num_attention_heads=8)
    model = tiny_model("alibi", num_layers=3, hidden_size=64, num_attention_heads=8)
    with pytest.raises(ArchitectureMismatchError) as caught:
        load_model_weights(model, root, cfg=cfg)
    assert set(caught.value.fields) == {"num_layers", "hidden_size", "num_attention_heads", "pos_emb"}
    for name in caught.value.fields:
        assert name in str(caught.value)


def test_padded_vocab_mismatch_explains_the_model_parallel_padding(tmp_path):
    root = write_reference_checkpoint(tmp_path, reference_tensors("kerple_log"), pos_emb="kerple_log", ranks=2)
    cfg = tiny_config("kerple_log", vocab_size=40)  # pads to 40 instead of the checkpoint's 64
    with pytest.raises(ArchitectureMismatchError, match="padded_vocab_size: checkpoint 64 vs config 40.*model_parallel_size 2"):
        load_model_weights(tiny_model("kerple_log", vocab_size=40), root, cfg=cfg)


def test_model_parallel_size_in_args_must_match_the_files(tmp_path):
    root = write_reference_checkpoint(
        tmp_path, reference_tensors("kerple_log"), pos_emb="kerple_log", args_overrides={"model_parallel_size": 2}
    )
    with pytest.raises(ModelParallelError, match="args.model_parallel_size is 2 but the pipeline files hold 1"):
        read_checkpoint(root)


def test_missing_rank_file_is_named(tmp_path):
    root = write_reference_checkpoint(tmp_path, reference_tensors("kerple_log"), pos_emb="kerple_log", ranks=2)
    (root / "global_step50" / "layer_03-model_01-model_states.pt").unlink()
    with pytest.raises(ModelParallelError, match="model_01"):
        read_checkpoint(root)


def test_learned_and_rotary_checkpoints_load(tmp_path):
    for pos_emb in ("learned", "rotary"):
        files = reference_tensors(pos_emb)
        root = write_reference_checkpoint(tmp_path / pos_emb, files, pos_emb=pos_emb, ranks=2)
        model = tiny_model(pos_emb)
        load_model_weights(model, root, cfg=tiny_config(pos_emb))
        with torch.no_grad():
            torch.testing.assert_close(model(TOKENS), _native_logits(pos_emb, files), rtol=0, atol=0)


def test_rank_shard_of_a_merged_checkpoint(tmp_path):
    """Re-splitting to this run's MP size hands each rank the reference's own piece."""
    from kerple.checkpoint import ShardSpec, split_model_parallel

    files = reference_tensors("rpe")
    root = write_reference_checkpoint(tmp_path, files, pos_emb="rpe", ranks=2)
    merged = read_checkpoint(root).state_dict
    shards = split_model_parallel(merged, 2, ShardSpec(num_heads=HEADS, hidden_size=32))
    rank1 = torch.load(root / "global_step50" / "layer_02-model_01-model_states.pt", weights_only=True)
    for key, tensor in rank1.items():
        assert torch.equal(shards[1][f"sequential.2.{key}"], tensor), key


@pytest.mark.parametrize("assumed", ["kerple_log", "kerple_power"])
def test_an_unnamed_kerple_embedding_is_loaded_with_a_warning(tmp_path, caplog, assumed):
    """kerple_log and kerple_power share bias_p/bias_a: without args.pos_emb and configs/ the
    checkpoint cannot say which it is, so the config's choice is used and named in a warning."""
    import logging
    import shutil

    root = write_reference_checkpoint(tmp_path, reference_tensors("kerple_log"), pos_emb="kerple_log")
    with caplog.at_level(logging.WARNING, logger="kerple"):
        load_model_weights(tiny_model("kerple_log"), root, cfg=tiny_config("kerple_log"))
    assert "names no positional embedding" not in caplog.text  # configs/ names it
    shutil.rmtree(root / "global_step50" / "configs")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kerple"):
        load_model_weights(tiny_model(assumed), root, cfg=tiny_config(assumed))
    assert "names no positional embedding" in caplog.text
    assert f"loaded as the config's pos_emb {assumed}" in caplog.text
    assert "kerple_log and kerple_power store the same tensors" in caplog.text


def test_a_namespace_args_record_resumes_as_a_reference_checkpoint(tmp_path):
    """Megatron-style records keep ``args`` as an ``argparse.Namespace``: training from such a
    checkpoint (``load`` + ``finetune``) reads its step, as evaluation reads its architecture."""
    import argparse

    from kerple.checkpoint.run_state import RunState, read_run_state

    record = {"iteration": 7, "args": argparse.Namespace(num_layers=2, hidden_size=64, model_parallel_size=1)}
    torch.save(record, tmp_path / "mp_rank_00_model_states.pt")
    state = read_run_state(tmp_path, parallel=None, iteration=7)
    assert (state.iteration, state.is_own_format) == (7, False)
    assert RunState.from_record(record).args == {"num_layers": 2, "hidden_size": 64, "model_parallel_size": 1}


def test_a_vocab_size_taken_from_the_tokenizer_is_named_in_a_mismatch() -> None:
    """A config that sets no vocab_size now gets its tokenizer's (CharLevelTokenizer: 512 ids, padded to
    512); a checkpoint of 50,304 rows, from when an unset vocab_size meant 50,257, is refused with the fix."""
    from pathlib import Path

    from kerple.checkpoint.architecture import check_architecture
    from kerple.config import load_config

    repo = Path(__file__).resolve().parents[3]
    cfg = load_config([repo / "configs/models/tiny.yml"], {"tokenizer_type": "CharLevelTokenizer"})
    assert cfg.model.padded_vocab_size == 512
    with pytest.raises(ArchitectureMismatchError, match=r"checkpoint 50304 vs config 512 \(no file sets vocab_size, "
                                                        r"so it is the tokenizer's, 512.*vocab_size: 50257\)"):
        check_architecture({"padded_vocab_size": 50304}, cfg, "old-run")
    set_explicitly = load_config([repo / "configs/models/tiny.yml"], {"tokenizer_type": "CharLevelTokenizer",
                                                                      "vocab_size": 512})
    with pytest.raises(ArchitectureMismatchError) as caught:
        check_architecture({"padded_vocab_size": 50304}, set_explicitly, "old-run")
    assert "tokenizer's" not in str(caught.value)
