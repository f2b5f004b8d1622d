"""Tokenizers with the reference's interface, all backed by the ``tokenizers``/``sentencepiece`` libraries.

Every tokenizer has ``name``, ``vocab_size``, ``eod`` (end-of-document id appended by
``--append-eod``), ``tokenize(text)``, ``tokenize_batch(texts)`` and ``detokenize(ids)``.
Tokenizers are picklable (they are rebuilt from their files), so worker processes can use them.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from kerple.atomic import atomic_path
from kerple.data.errors import DataError

EOD_TEXT = "<|endoftext|>"
MIN_BPE_VOCAB = 256 + 1
"""The smallest byte-level BPE: one id per byte and ``<|endoftext|>``, no merges."""
TOKENIZER_TYPES = ("GPT2BPETokenizer", "HFTokenizer", "SPMTokenizer", "CharLevelTokenizer")


def _require_file(path: str | Path | None, what: str) -> Path:
    if path is None or str(path) == "":
        raise DataError(f"{what} is required for this tokenizer type")
    resolved = Path(path)
    if not resolved.is_file():
        raise DataError(f"{resolved}: {what} not found")
    return resolved


class Tokenizer(ABC):
    """Common interface of the project's tokenizers."""

    name: str

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (before padding for the model)."""

    @property
    @abstractmethod
    def eod(self) -> int:
        """End-of-document id."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Ids of one text."""

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Ids of several texts (the library's batch path where it has one)."""
        return [self.tokenize(text) for text in texts]

    @abstractmethod
    def detokenize(self, token_ids: list[int]) -> str:
        """Text of a list of ids."""

    def describe(self) -> dict[str, Any]:
        """Type and files, as recorded in a prepared dataset's info file."""
        return {"tokenizer_type": self.name}


class _LibraryTokenizer(Tokenizer):
    """Shared code of the two ``tokenizers``-library tokenizers; the library object is rebuilt
    lazily after unpickling."""

    def __init__(self) -> None:
        self._backend: Any = None

    @abstractmethod
    def _build(self) -> Any:
        """Create the ``tokenizers.Tokenizer``."""

    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        if self._backend is None:
            self._backend = self._build()
        return self._backend

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_backend"] = None
        return state

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def tokenize(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.backend.encode_batch(texts)]

    def detokenize(self, token_ids: list[int]) -> str:
        return self.backend.decode(list(token_ids))


class GPT2BPETokenizer(_LibraryTokenizer):
    """GPT-2 byte-level BPE from ``vocab.json`` (encoder.json) + ``merges.txt`` (vocab.bpe).

    As in the reference, ``<|endoftext|>`` inside the text is ordinary text; the EOD id (50256
    for GPT-2) is only ever appended.
    """

    name = "GPT2BPETokenizer"

    def __init__(self, vocab_file: str | Path, merge_file: str | Path) -> None:
        super().__init__()
        self.vocab_file = _require_file(vocab_file, "vocab-file (GPT-2 vocab.json)")
        self.merge_file = _require_file(merge_file, "merge-file (GPT-2 merges.txt)")
        self._eod = self.backend.token_to_id(EOD_TEXT)
        if self._eod is None:
            raise DataError(f"{self.vocab_file}: no {EOD_TEXT} entry in the vocabulary")

    def _build(self) -> Any:
        from tokenizers import Tokenizer as Backend
        from tokenizers import decoders, models, pre_tokenizers

        try:
            model = models.BPE.from_file(str(self.vocab_file), str(self.merge_file))
        except Exception as error:  # the library raises plain Exception on bad files
            raise DataError(f"{self.vocab_file} / {self.merge_file}: not a GPT-2 BPE vocabulary ({error})") from error
        backend = Backend(model)
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        return backend

    @property
    def eod(self) -> int:
        return int(self._eod)

    def describe(self) -> dict[str, Any]:
        return {"tokenizer_type": self.name, "vocab_file": str(self.vocab_file), "merge_file": str(self.merge_file)}


class HFTokenizer(_LibraryTokenizer):
    """A ``tokenizers`` JSON file (e.g. GPT-NeoX-20B's ``20B_tokenizer.json``); EOD is the id of
    ``<|endoftext|>``, else of the tokenizer's ``</s>``/``<eos>``."""

    name = "HFTokenizer"

    def __init__(self, tokenizer_file: str | Path) -> None:
        super().__init__()
        self.tokenizer_file = _require_file(tokenizer_file, "tokenizer file (tokenizer.json)")
        for candidate in (EOD_TEXT, "</s>", "<eos>", "<|eos|>"):
            found = self.backend.token_to_id(candidate)
            if found is not None:
                self._eod = int(found)
                break
        else:
            raise DataError(f"{self.tokenizer_file}: no end-of-document token ({EOD_TEXT}, </s>, <eos>)")

    def _build(self) -> Any:
        from tokenizers import Tokenizer as Backend

        try:
            return Backend.from_file(str(self.tokenizer_file))
        except Exception as error:
            raise DataError(f"{self.tokenizer_file}: not a tokenizers JSON file ({error})") from error

    @property
    def eod(self) -> int:
        return self._eod

    def describe(self) -> dict[str, Any]:
        return {"tokenizer_type": self.name, "vocab_file": str(self.tokenizer_file)}


class SPMTokenizer(Tokenizer):
    """A SentencePiece model; EOD is ``<|endoftext|>`` when the model has it, else its EOS id."""

    name = "SPMTokenizer"

    def __init__(self, model_file: str | Path) -> None:
        self.model_file = _require_file(model_file, "SentencePiece model file")
        self._processor: Any = None
        processor = self.processor
        eod = processor.piece_to_id(EOD_TEXT)
        if eod == processor.unk_id() or eod < 0:
            eod = processor.eos_id()
        if eod < 0:
            raise DataError(f"{self.model_file}: no {EOD_TEXT} piece and no EOS id")
        self._eod = int(eod)

    @property
    def processor(self) -> Any:
        """The ``sentencepiece.SentencePieceProcessor``."""
        if self._processor is None:
            import sentencepiece

            try:
                self._processor = sentencepiece.SentencePieceProcessor(model_file=str(self.model_file))
            except (OSError, RuntimeError) as error:
                raise DataError(f"{self.model_file}: not a SentencePiece model ({error})") from error
        return self._processor

    def __getstate__(self) -> dict[str, Any]:
        return {"model_file": self.model_file, "_eod": self._eod, "_processor": None}

    @property
    def vocab_size(self) -> int:
        return int(self.processor.get_piece_size())

    @property
    def eod(self) -> int:
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        return list(self.processor.encode(text))

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self.processor.encode(texts)]

    def detokenize(self, token_ids: list[int]) -> str:
        return self.processor.decode(list(token_ids))

    def describe(self) -> dict[str, Any]:
        return {"tokenizer_type": self.name, "vocab_file": str(self.model_file)}


class CharLevelTokenizer(Tokenizer):
    """The reference's character tokenizer: the text's UTF-8 bytes are the ids (a newline is 10, "é" is
    195, 169); EOD 0. Decoding maps each id to one character, clamped to ``[32, vocab_size - 1]``."""

    name = "CharLevelTokenizer"

    def __init__(self, vocab_size: int = 512) -> None:
        self._vocab_size = vocab_size

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eod(self) -> int:
        return 0

    def _clamp(self, value: int) -> int:
        return max(32, min(value, self._vocab_size - 1))

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8", "surrogatepass"))

    def detokenize(self, token_ids: list[int]) -> str:
        return "".join(chr(self._clamp(int(token))) for token in token_ids)


def build_tokenizer(
    tokenizer_type: str,
    vocab_file: str | Path | None = None,
    merge_file: str | Path | None = None,
    tokenizer_file: str | Path | None = None,
) -> Tokenizer:
    """The tokenizer named by a NeoX ``tokenizer-type``.

    ``HFTokenizer`` and ``SPMTokenizer`` read ``tokenizer_file`` or, as in NeoX configs,
    ``vocab_file``. ``HFGPT2Tokenizer`` is accepted as GPT-2 BPE from the same files.
    """
    kind = tokenizer_type.strip()
    if kind in ("GPT2BPETokenizer", "HFGPT2Tokenizer"):
        return GPT2BPETokenizer(vocab_file, merge_file)  # type: ignore[arg-type]
    if kind == "HFTokenizer":
        return HFTokenizer(tokenizer_file or vocab_file)  # type: ignore[arg-type]
    if kind in ("SPMTokenizer", "SentencePieceTokenizer"):
        return SPMTokenizer(tokenizer_file or vocab_file)  # type: ignore[arg-type]
    if kind == "CharLevelTokenizer":
        return CharLevelTokenizer()
    raise DataError(f"unknown tokenizer type {tokenizer_type!r} (known: {', '.join(TOKENIZER_TYPES)})")


def train_bpe_tokenizer(texts: Any, vocab_size: int, output_file: str | Path) -> HFTokenizer:
    """Train a byte-level BPE (``tokenizers``) on an iterable of texts; save it as tokenizer.json.

    ``<|endoftext|>`` is id 0 of the trained vocabulary. Written to a temporary name, then renamed.
    """
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_BPE_VOCAB:
        raise DataError(f"--train-tokenizer {vocab_size}: a byte-level BPE needs at least {MIN_BPE_VOCAB} ids "
                        "(256 bytes and <|endoftext|>)")
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    output = Path(output_file)
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(output) as temporary:
        backend.save(str(temporary))
    return HFTokenizer(output)


def configured_tokenizer(cfg: Any) -> Tokenizer | None:
    """The tokenizer a config's data keys name, or ``None`` when they name no file (a corpus
    prepared elsewhere needs none to train); a named file that is missing or unreadable is a
    :class:`DataError` naming the key and the config file that set it."""
    data = cfg.data
    files = {"tokenizer_file": data.tokenizer_file, "vocab_file": data.vocab_file, "merge_file": data.merge_file}
    if data.tokenizer_type != "CharLevelTokenizer" and not any(files.values()):
        return None
    try:
        return build_tokenizer(data.tokenizer_type, data.vocab_file, data.merge_file, data.tokenizer_file)
    except DataError as error:
        named = [f"{key} {value} ({cfg.provenance(f'data.{key}')[0]})" for key, value in files.items() if value]
        reason = str(error)
        for value in files.values():  # the message starts with the path the list above names already
            reason = reason.removeprefix(f"{Path(value)}: ") if value else reason
        raise DataError(f"{'; '.join(named) or 'tokenizer_type ' + data.tokenizer_type}: {reason}; "
                        "fix the path in the config or prepare the data again (prepare_data.py)") from None


def tokenizer_vocab_size(tokenizer_type: str, vocab_file: str | None = None, merge_file: str | None = None,
                         tokenizer_file: str | None = None) -> int | None:
    """The vocabulary of the tokenizer these keys name, which GPT-NeoX gives its model (it has no
    ``vocab_size`` key: docs/reference-format.md §4); ``None`` when its files are not there (yet)."""
    if tokenizer_type.strip() == "CharLevelTokenizer":
        return CharLevelTokenizer().vocab_size
    files = [name for name in (vocab_file, merge_file, tokenizer_file) if name]
    if not files or not all(Path(name).is_file() for name in files):
        return None
    stamps = tuple((str(Path(name).resolve()), Path(name).stat().st_mtime_ns) for name in files)
    return _file_vocab_size(tokenizer_type, vocab_file, merge_file, tokenizer_file, stamps)


@functools.lru_cache(maxsize=16)
def _file_vocab_size(tokenizer_type: str, vocab_file: str | None, merge_file: str | None,
                     tokenizer_file: str | None, stamps: tuple[tuple[str, int], ...]) -> int | None:
    """:func:`tokenizer_vocab_size` of files, read once per content (``stamps``: paths and mtimes)."""
    del stamps  # part of the cache key only
    try:
        return build_tokenizer(tokenizer_type, vocab_file, merge_file, tokenizer_file).vocab_size
    except DataError:  # an unreadable file is named where the data is read, with its key
        return None


def check_vocabulary_fits(cfg: Any, tokenizer: Tokenizer | None = None) -> None:
    """Refuse a model vocabulary (``padded_vocab_size``) smaller than the tokenizer's: its token ids
    would index past the embedding table. ``tokenizer`` defaults to :func:`configured_tokenizer`."""
    tokenizer = tokenizer or configured_tokenizer(cfg)
    padded = int(cfg.model.padded_vocab_size)
    if tokenizer is None or tokenizer.vocab_size <= padded:
        return
    source = cfg.provenance("model.vocab_size")[0]
    raise DataError(
        f"the tokenizer ({tokenizer.describe().get('vocab_file', tokenizer.name)}) has {tokenizer.vocab_size} tokens "
        f"but the model's vocabulary holds {padded} (vocab_size={cfg.model.vocab_size} ({source}) padded to a multiple "
        f"of make_vocab_size_divisible_by x model_parallel_size); set vocab_size to at least {tokenizer.vocab_size}"
    )
