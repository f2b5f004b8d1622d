"""Derived values: precision, padded vocabulary, head size, batch triple, schedule length, and
the validation hooks into the positional registry and the attention implementations."""

from __future__ import annotations

import pytest
import torch

from kerple.config import ConfigError, load_config

pytestmark = pytest.mark.usefixtures("fake_attention")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "fp32"),
        ("fp16: {enabled: true}\n", "fp16"),
        ("fp16: {enabled: true, type: bfloat16, loss_scale: 0, loss_scale_window: 1000}\n", "bf16"),
        ("bf16: {enabled: true}\n", "bf16"),
        ("fp16: {enabled: false, type: bfloat16}\n", "bf16"),  # the KERPLE fork: type decides, enabled or not
        ("fp16: {enabled: false, type: null}\n", "fp32"),
        ("precision: bf16\n", "bf16"),
        ("precision: bfloat16\nfp16: {enabled: true, type: bfloat16}\n", "bf16"),
    ],
)
def test_precision_from_blocks(write, text, expected):
    assert load_config([write("p.yml", text)]).precision.precision == expected


def test_precision_key_alone_enables_the_block(write):
    cfg = load_config([write("p.yml", "precision: fp16\n")])
    assert cfg.precision.precision == "fp16"
    assert cfg.precision.fp16_enabled is True and cfg.precision.bf16_enabled is False


def test_precision_key_contradicting_an_enabled_block_is_an_error(write):
    path = write("p.yml", "bf16: {enabled: true}\n")
    with pytest.raises(ConfigError) as info:
        load_config([path], {"precision": "fp32"})
    message = str(info.value)
    assert path in message and "<command line>" in message and "precision" in message and "bf16.enabled" in message


def test_fp16_and_bf16_both_enabled_is_an_error(write):
    path = write("p.yml", "fp16: {enabled: true}\nbf16: {enabled: true}\n")
    with pytest.raises(ConfigError, match="fp16.enabled"):
        load_config([path])


@pytest.mark.parametrize(
    ("vocab", "divisible_by", "model_parallel", "padded"),
    [
        (50257, 128, 1, 50304),  # GPT-2 BPE, the paper's 162M setup: 393 * 128
        (50257, 128, 2, 50432),  # 1.3B setup, model-parallel 2: 197 * 256
        (50304, 128, 1, 50304),  # already a multiple
        (256, 128, 4, 512),  # rounded up to one block of 512
        (50257, 1, 1, 50257),
    ],
)
def test_padded_vocab_size(write, vocab, divisible_by, model_parallel, padded):
    text = f"vocab_size: {vocab}\nmake-vocab-size-divisible-by: {divisible_by}\nmodel-parallel-size: {model_parallel}\n"
    assert load_config([write("v.yml", text)]).model.padded_vocab_size == padded


def test_head_dim_and_defaults_filled_from_other_keys(write):
    cfg = load_config([write("m.yml", "hidden-size: 2048\nnum-attention-heads: 16\nseq-length: 1024\ntrain-iters: 777\n")])
    assert cfg.model.head_dim == 128
    assert cfg.model.max_position_embeddings == 1024  # null means seq_length
    assert cfg.lr_schedule.lr_decay_iters == 777  # null means train_iters
    assert cfg.logging.use_tensorboard is False  # no tensorboard_dir
    with_dir = load_config([write("t.yml", "tensorboard-dir: runs\n")])
    assert with_dir.logging.use_tensorboard is True


# ---- batch triple -------------------------------------------------------------------------------


def _batch(write, text: str, world_size: int) -> tuple[int, int, int, int]:
    cfg = load_config([write("b.yml", text)]).resolve_batch(world_size)
    t = cfg.training
    return t.micro_batch_size, t.gradient_accumulation_steps, t.train_batch_size, cfg.parallelism.data_parallel_size


def test_batch_from_micro_only(write):
    # world 8, model-parallel 2, pipe 1 -> dp 4; accumulation defaults to 1 -> 32 * 1 * 4
    text = "train_micro_batch_size_per_gpu: 32\nmodel-parallel-size: 2\npipe-parallel-size: 1\n"
    assert _batch(write, text, 8) == (32, 1, 128, 4)


def test_batch_micro_and_total_give_accumulation(write):
    assert _batch(write, "train_micro_batch_size_per_gpu: 16\ntrain_batch_size: 256\n", 4) == (16, 4, 256, 4)


def test_batch_accumulation_and_total_give_micro(write):
    assert _batch(write, "gradient_accumulation_steps: 3\ntrain_batch_size: 96\n", 4) == (8, 3, 96, 4)


def test_batch_micro_and_accumulation_give_total(write):
    # pipe 0 counts as one stage: dp = 6 / (1 * 3) = 2
    text = "micro_batch_size: 5\ngradient_accumulation_steps: 2\nmodel_parallel_size: 3\npipe_parallel_size: 0\n"
    assert _batch(write, text, 6) == (5, 2, 20, 2)


def test_batch_total_only(write):
    assert _batch(write, "train_batch_size: 64\n", 8) == (8, 1, 64, 8)


def test_batch_all_three_consistent(write):
    text = "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 2\ntrain_batch_size: 16\n"
    assert _batch(write, text, 2) == (4, 2, 16, 2)


def test_batch_all_three_inconsistent_names_file_and_keys(write):
    path = write("b.yml", "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 2\ntrain_batch_size: 16\n")
    cfg = load_config([path])
    with pytest.raises(ConfigError) as info:
        cfg.resolve_batch(4)  # 4 * 2 * 4 = 32, not 16
    message = str(info.value)
    assert path in message and "train_batch_size" in message and "train_micro_batch_size_per_gpu" in message
    assert "32" in message


def test_batch_total_not_divisible_is_an_error(write):
    cfg = load_config([write("b.yml", "train_micro_batch_size_per_gpu: 3\ntrain_batch_size: 30\n")])
    with pytest.raises(ConfigError, match="not divisible"):
        cfg.resolve_batch(4)  # 30 / (3 * 4) is not an integer


def test_batch_inconsistent_at_load_time_without_world_size(write):
    path = write("b.yml", "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 3\ntrain_batch_size: 16\n")
    with pytest.raises(ConfigError) as info:
        load_config([path])
    assert path in str(info.value) and "12" in str(info.value)


def test_world_size_not_divisible_by_model_parallel(write):
    path = write("b.yml", "train_micro_batch_size_per_gpu: 4\nmodel-parallel-size: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config([path]).resolve_batch(3)
    assert path in str(info.value) and "model-parallel-size" in str(info.value)


def test_batch_needs_micro_or_total(write):
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu"):
        load_config([write("b.yml", "gradient_accumulation_steps: 2\n")]).resolve_batch(1)


# ---- registry and attention hooks ---------------------------------------------------------------


def test_attention_hook_receives_family_device_and_training(write, fake_attention):
    load_config([write("a.yml", "pos_emb: kerple_log\nattention_impl: sdpa\n")])
    load_config([write("b.yml", "pos_emb: alibi\ntrain-iters: 0\n")])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert fake_attention.calls == [("sdpa", "bias", device, True), ("eager", "bias", device, False)]


def test_refused_combination_names_both_keys_and_file(write, fake_attention):
    path = write("a.yml", "pos-emb: kerple_log\nattention-impl: flex\n")
    with pytest.raises(ConfigError) as info:
        load_config([path])
    message = str(info.value)
    assert path in message and "attention-impl" in message and "pos-emb" in message
    assert fake_attention.refusal in message


def test_same_combination_allowed_for_evaluation_only(write):
    cfg = load_config([write("a.yml", "pos-emb: kerple_log\nattention-impl: flex\ntrain-iters: 0\n")])
    assert cfg.attention.attention_impl == "flex"


def test_learned_embedding_cannot_be_evaluated_beyond_its_table(write):
    path = write("l.yml", "pos_emb: learned\nseq_length: 512\nmax_position_embeddings: 1024\n")
    cfg = load_config([path])
    cfg.check_eval_length(1024)  # within the table
    with pytest.raises(ConfigError) as info:
        cfg.check_eval_length(1025)
    assert path in str(info.value) and "max_position_embeddings" in str(info.value) and "1025" in str(info.value)


def test_extrapolating_embedding_has_no_eval_limit(write):
    load_config([write("a.yml", "pos_emb: alibi\nseq_length: 512\n")]).check_eval_length(16384)


def test_seq_length_val_beyond_learned_table_fails_at_load(write):
    path = write("l.yml", "pos-emb: learned\nseq-length: 512\nseq-length-val: 2048\n")
    with pytest.raises(ConfigError) as info:
        load_config([path])
    assert path in str(info.value) and "2048" in str(info.value)


def _word_level_tokenizer(path, size: int) -> str:
    """A Hugging Face tokenizer.json of exactly ``size`` ids, written with the tokenizers library."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    words = {f"w{i}": i for i in range(size - 1)} | {"<|endoftext|>": size - 1}
    Tokenizer(WordLevel(words, unk_token="w0")).save(str(path))
    return str(path)


@pytest.mark.parametrize(
    ("text", "vocab", "padded"),
    [
        ("tokenizer-type: CharLevelTokenizer\n", 512, 512),  # the reference's character tokenizer: 512 ids
        ("tokenizer-type: CharLevelTokenizer\nmodel-parallel-size: 4\n", 512, 512),
        ("tokenizer-type: CharLevelTokenizer\nvocab-size: 1000\n", 1000, 1024),  # a set vocab_size wins
        ("tokenizer-type: HFTokenizer\nvocab-file: {tok}\n", 300, 384),
        ("tokenizer-type: HFTokenizer\nvocab-file: {tok}\nmake-vocab-size-divisible-by: 1\n", 300, 300),
        ("tokenizer-type: HFTokenizer\nvocab-file: {missing}\n", 50257, 50304),  # not there yet: the default
        ("tokenizer-type: GPT2BPETokenizer\n", 50257, 50304),
    ],
)
def test_vocab_size_unset_comes_from_the_tokenizer(write, tmp_path, text, vocab, padded):
    """GPT-NeoX has no vocab_size key: its model has the tokenizer's vocabulary (docs/reference-format.md §4)."""
    tok = _word_level_tokenizer(tmp_path / "tokenizer.json", 300)
    cfg = load_config([write("v.yml", text.format(tok=tok, missing=tmp_path / "absent.json"))])
    assert (cfg.model.vocab_size, cfg.model.padded_vocab_size) == (vocab, padded)
