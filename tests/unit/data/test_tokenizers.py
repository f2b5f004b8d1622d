"""Tokenizer ids against the libraries used directly (and GPT-2 against transformers' Python BPE)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from kerple.data.errors import DataError
from kerple.data.tokenizers import CharLevelTokenizer, build_tokenizer, train_bpe_tokenizer

TEXTS = [
    "Hello world! It's 2024 - naïve café, 東京, emoji 🙂.",
    "def f(x):\n    if x:\n        return   x  # comment\n\treturn None\n",
    "  leading spaces and trailing   \n\n\n",
    "<|endoftext|> in the middle <|endoftext|>",
    "",
]


def test_hf_tokenizer_matches_library(neox20b_file: Path) -> None:
    from tokenizers import Tokenizer

    library = Tokenizer.from_file(str(neox20b_file))
    ours = build_tokenizer("HFTokenizer", vocab_file=neox20b_file)
    for text in TEXTS:
        assert ours.tokenize(text) == library.encode(text).ids
    assert ours.tokenize_batch(TEXTS) == [e.ids for e in library.encode_batch(TEXTS)]
    assert ours.eod == library.token_to_id("<|endoftext|>") == 0
    assert ours.vocab_size == library.get_vocab_size() == 50277
    assert ours.detokenize(ours.tokenize(TEXTS[1])) == TEXTS[1]
    clone = pickle.loads(pickle.dumps(ours))
    assert clone.tokenize(TEXTS[0]) == ours.tokenize(TEXTS[0])


def test_gpt2_bpe_matches_library_and_python_bpe(gpt2_files: tuple[Path, Path]) -> None:
    from tokenizers import ByteLevelBPETokenizer

    vocab, merges = gpt2_files
    ours = build_tokenizer("GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)
    library = ByteLevelBPETokenizer(str(vocab), str(merges))
    assert ours.eod == 50256 and ours.vocab_size == 50257
    for text in TEXTS:
        assert ours.tokenize(text) == library.encode(text).ids
        assert ours.detokenize(ours.tokenize(text)) == text
    assert ours.tokenize("Hello world") == [15496, 995]
    transformers = pytest.importorskip("transformers")
    python_bpe = transformers.GPT2Tokenizer(str(vocab), str(merges))
    for text in TEXTS[:3]:
        assert ours.tokenize(text) == python_bpe.encode(text)


def test_sentencepiece_matches_library(tmp_path: Path) -> None:
    import sentencepiece

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"line {i} of the tiny corpus with words {i * 7}" for i in range(300)))
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"),
                                             vocab_size=60, model_type="bpe", minloglevel=2)
    model = tmp_path / "spm.model"
    ours = build_tokenizer("SPMTokenizer", vocab_file=model)
    library = sentencepiece.SentencePieceProcessor(model_file=str(model))
    text = "line 3 of the corpus"
    assert ours.tokenize(text) == library.encode(text)
    assert ours.eod == library.eos_id() and ours.vocab_size == 60
    assert ours.detokenize(ours.tokenize(text)) == text
    assert pickle.loads(pickle.dumps(ours)).tokenize(text) == library.encode(text)


def test_char_level() -> None:
    """The reference tokenizes with ``np.fromstring(text, dtype=np.uint8)``: the UTF-8 bytes, unclamped (a
    newline stays 10, "東" is the three bytes E6 9D B1); it decodes one character per id, clamped to >= 32."""
    tokenizer = CharLevelTokenizer()
    assert tokenizer.tokenize("Az\n\t") == [65, 122, 10, 9]
    assert tokenizer.tokenize("é東") == [0xC3, 0xA9, 0xE6, 0x9D, 0xB1]
    assert tokenizer.detokenize([72, 105, 10]) == "Hi " and tokenizer.eod == 0


def test_trained_bpe(tmp_path: Path) -> None:
    texts = [f"def function_{i}(value):\n    return value * {i}\n" for i in range(200)]
    tokenizer = train_bpe_tokenizer(iter(texts), 400, tmp_path / "bpe.json")
    assert tokenizer.eod == 0 and tokenizer.vocab_size <= 400
    assert tokenizer.detokenize(tokenizer.tokenize(texts[5])) == texts[5]
    assert len(tokenizer.tokenize(texts[5])) < len(texts[5]) / 2


def test_missing_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.json: tokenizer file \(tokenizer.json\) not found"):
        build_tokenizer("HFTokenizer", tokenizer_file=tmp_path / "nope.json")
    with pytest.raises(DataError, match="unknown tokenizer type 'Bert'"):
        build_tokenizer("Bert")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match=r"bad\.json: not a tokenizers JSON file"):
        build_tokenizer("HFTokenizer", tokenizer_file=tmp_path / "bad.json")


def test_a_vocabulary_smaller_than_the_tokenizers_is_refused_with_both_numbers() -> None:
    from kerple.config import load_config
    from kerple.data.tokenizers import check_vocabulary_fits

    cfg = load_config([], {"tokenizer_type": "CharLevelTokenizer", "vocab_size": 50, "make_vocab_size_divisible_by": 1})
    with pytest.raises(DataError) as info:
        check_vocabulary_fits(cfg)
    assert "has 512 tokens" in str(info.value) and "holds 50 (vocab_size=50 (<command line>)" in str(info.value)
    check_vocabulary_fits(load_config([], {"tokenizer_type": "CharLevelTokenizer", "vocab_size": 512}))


def test_a_tokenizer_file_the_config_names_must_exist(tmp_path: Path) -> None:
    from kerple.config import load_config
    from kerple.data.tokenizers import configured_tokenizer

    missing = tmp_path / "nope.json"
    cfg = load_config([], {"tokenizer_type": "HFTokenizer", "vocab_file": str(missing)})
    with pytest.raises(DataError) as info:
        configured_tokenizer(cfg)
    assert str(info.value).startswith(f"vocab_file {missing} (<command line>): tokenizer file")
    assert configured_tokenizer(load_config([], {"tokenizer_type": "HFTokenizer"})) is None  # no file named
