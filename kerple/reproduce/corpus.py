"""The lease's corpus: the Python sources on the machine, capped in tokens and in time.

``prepare_data.py python`` reads every source file and tokenizes all of them, which is right for
the chunked reproduction and too slow for one short GPU lease. This stage reads the same files
(``kerple.data.local_python``: the interpreter's standard library and site-packages, or ``--root``
folders; one copy per content) in the order of a hash of their key, so a capped corpus is a fair
sample of the files rather than the first packages in alphabetical order. Each file is held out by
the same hash (:func:`kerple.data.sources.path_hash`) with the scale's ``split`` shares, so no file
is in two splits. A byte-level BPE is trained on at most ``bpe_sample_chars`` of the train files;
then documents are tokenized until the token cap is reached, the sources run out, or the stage's
time is spent, whichever comes first; the info file records which (``source.cap.stopped_by``).

The files written are those of ``prepare_data.py`` (``<prefix>.{bin,idx}`` with train, then valid,
then test documents, the ``split`` string giving their exact counts, and ``<prefix>.info.json``),
so training and evaluation read them unchanged. Run as ``python -m kerple.reproduce.corpus`` in a
child process, like every stage.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerple.errors import KerpleError, entry_point

DEADLINE_RESERVE = 0.05  # of the stage's seconds, kept for writing the index and the info file
BATCH_CHARS = 4_000_000  # characters per tokenizer call (the library spreads one call over the cores)
CHARS_PER_TOKEN = 5  # more than a byte-level BPE of Python averages (about 4 at 50k ids): a batch near the cap


@dataclass(frozen=True)
class Document:
    """One distinct source file (``kerple.data.local_python.PythonFile``), its split and text."""

    file: Any
    split: str
    text: str


@dataclass
class Reading:
    """What was found and read (the ``source`` details of the info file)."""

    files_found: int = 0
    counts: Counter = field(default_factory=Counter)  # unreadable, duplicates_removed
    replaced_bytes: int = 0
    stopped_by: str = "sources"  # cap | deadline | sources
    kept: list[Document] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=lambda: {"train": 0, "valid": 0, "test": 0})

    @property
    def total(self) -> int:
        return sum(self.tokens.values())


def split_shares(split: str) -> tuple[float, float]:
    """(valid, test) shares of a ``train,valid,test`` weight string such as ``949,50,1``."""
    weights = ([float(part) for part in split.split(",")] + [0.0, 0.0])[:3]
    total = sum(weights)
    return weights[1] / total, weights[2] / total


def split_of(key: str, valid_share: float, test_share: float) -> str:
    """The split of a file by the hash of its key (the hash kerple.data uses to hold documents out)."""
    from kerple.data.sources import path_hash

    position = int(path_hash(key)[:15], 16) / 16**15
    return "test" if position < test_share else "valid" if position < test_share + valid_share else "train"


def reading_order(key: str) -> str:
    """The order files are read in: a hash of the key, another than the one that holds files out, so
    the order does not group the held-out files."""
    return hashlib.sha256(f"order:{key}".encode()).hexdigest()


def read_documents(found: list[tuple[Any, str, str]], roots: Sequence[Any], reading: Reading,
                   split: str) -> Iterator[Document]:
    """The distinct files of ``found`` in order, each once (the first of a content wins)."""
    from kerple.data.local_python import distinct_files
    from kerple.data.readers import decode_utf8_counting

    valid_share, test_share = split_shares(split)
    for item, payload in distinct_files(found, roots, reading.counts):
        text, replaced = decode_utf8_counting(payload)
        reading.replaced_bytes += replaced
        yield Document(item, split_of(item.key, valid_share, test_share), text)


def train_tokenizer(documents: Iterator[Document], sample_chars: int, vocab: int, path: Path,
                    deadline: float) -> tuple[Any, list[Document]]:
    """A byte-level BPE trained on the train documents read until ``sample_chars`` characters of
    them (or the deadline); returns it and every document read meanwhile (tokenized first)."""
    from kerple.data.tokenizers import train_bpe_tokenizer

    read: list[Document] = []
    characters = 0
    for document in documents:
        read.append(document)
        characters += len(document.text) if document.split == "train" else 0
        if characters >= sample_chars or time.monotonic() >= deadline:
            break
    sample = [document.text for document in read if document.split == "train"] or [d.text for d in read]
    if not sample:
        raise KerpleError("no .py files to read under the corpus roots (--root)")
    return train_bpe_tokenizer(sample, vocab, path), read


def next_batch(documents: Iterator[Document], characters: int) -> list[Document]:
    """The next documents, about ``characters`` characters of them (one tokenizer call)."""
    batch: list[Document] = []
    for document in documents:
        batch.append(document)
        characters -= len(document.text)
        if characters <= 0:
            break
    return batch


def tokenize(tokenizer: Any, documents: Iterator[Document], reading: Reading, max_tokens: int,
             deadline: float) -> dict[str, list[Any]]:
    """Token arrays per split, in reading order, until the cap, the deadline or the last document.
    A batch holds at most a few characters per token still missing, so the cap costs no large
    batch tokenized in vain."""
    import numpy as np

    from kerple.data.indexed_dataset import best_fitting_dtype

    dtype = np.dtype(best_fitting_dtype(tokenizer.vocab_size))
    arrays: dict[str, list[Any]] = {"train": [], "valid": [], "test": []}
    while batch := next_batch(documents, min(BATCH_CHARS, CHARS_PER_TOKEN * (max_tokens - reading.total) + 1)):
        if time.monotonic() >= deadline:
            reading.stopped_by = "deadline"
            return arrays
        for document, ids in zip(batch, tokenizer.tokenize_batch([d.text for d in batch])):
            if not ids:
                continue
            arrays[document.split].append(np.asarray([*ids, tokenizer.eod], dtype=dtype))
            reading.kept.append(document)
            reading.tokens[document.split] += len(ids) + 1
            if reading.total >= max_tokens:
                reading.stopped_by = "cap"
                return arrays
    return arrays


def write_dataset(prefix: Path, arrays: dict[str, list[Any]]) -> None:
    """``<prefix>.{bin,idx}``: train, then valid, then test documents (``split`` gives the counts)."""
    from kerple.data.indexed_dataset import IndexedDatasetWriter

    dtype = arrays["train"][0].dtype if arrays["train"] else next(a for v in arrays.values() for a in v).dtype
    writer = IndexedDatasetWriter(prefix, dtype.type)
    try:
        for part in ("train", "valid", "test"):
            for array in arrays[part]:
                writer.add_document(array)
        writer.finalize()
    finally:
        writer.abort()


def info_document(prefix: Path, tokenizer: Any, roots: Sequence[Any], reading: Reading, options: argparse.Namespace,
                  seconds: float) -> dict[str, Any]:
    """The ``info.json`` of ``prepare_data.py``, with the cap and what stopped the reading."""
    from kerple.data.local_python import found_details

    counts = Counter(document.split for document in reading.kept)
    parts = {name: {"documents": counts[name], "tokens": reading.tokens[name]} for name in ("train", "valid", "test")}
    source = {
        **found_details(roots, reading.files_found, reading.counts, [document.file for document in reading.kept]),
        "cap": {"max_tokens": options.max_tokens, "seconds_allowed": options.seconds, "stopped_by": reading.stopped_by,
                "bpe_sample_chars": options.bpe_sample_chars, "seconds": round(seconds, 1)},
    }
    return {"prefix": str(prefix), "split": ",".join(str(counts[name]) for name in ("train", "valid", "test")),
            "tokenizer": tokenizer.describe(), "parts": parts, "tokens": reading.total,
            "seconds": round(seconds, 1), "replaced_bytes": reading.replaced_bytes, "source": source}


def build(options: argparse.Namespace) -> dict[str, Any]:
    """Read, tokenize and write the capped corpus; returns its info document."""
    from kerple.atomic import write_json_atomic
    from kerple.data.local_python import candidates, default_roots, roots_from_paths

    started = time.monotonic()
    deadline = started + options.seconds * (1.0 - DEADLINE_RESERVE)
    roots = roots_from_paths(options.root) if options.root else default_roots()
    found = candidates(roots, order=reading_order)
    reading = Reading(files_found=len(found))
    prefix = Path(options.prefix)
    documents = read_documents(found, roots, reading, options.split)
    tokenizer, first = train_tokenizer(documents, options.bpe_sample_chars, options.vocab,
                                       prefix.parent / f"{prefix.parent.name}_bpe{options.vocab}.json", deadline)
    arrays = tokenize(tokenizer, itertools.chain(first, documents), reading, options.max_tokens, deadline)
    if not reading.kept:
        raise KerpleError(f"the corpus stage's {options.seconds:g} s were spent before any document was tokenized: "
                          "give more --minutes")
    write_dataset(prefix, arrays)
    info = info_document(prefix, tokenizer, roots, reading, options, time.monotonic() - started)
    write_json_atomic(Path(f"{prefix}.info.json"), info)
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kerple.reproduce.corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", required=True, help="<folder>/python_text_document")
    parser.add_argument("--vocab", type=int, required=True, help="size of the byte-level BPE to train")
    parser.add_argument("--split", required=True, help="train,valid,test weights, e.g. 949,50,1")
    parser.add_argument("--max-tokens", type=int, required=True, help="stop once the corpus holds this many tokens")
    parser.add_argument("--seconds", type=float, required=True, help="stop reading and tokenizing after this long")
    parser.add_argument("--bpe-sample-chars", type=int, required=True, help="train the BPE on this much train text")
    parser.add_argument("--root", action="append", default=[], help="read the .py files under this folder")
    return parser.parse_args(argv)


@entry_point("kerple.reproduce.corpus")
def main(argv: list[str] | None = None) -> int:
    info = build(parse_args(argv))
    cap = info["source"]["cap"]
    print(f"corpus: {info['tokens']:,} tokens from {info['source']['files_kept']:,} files "
          f"(train {info['parts']['train']['tokens']:,}, valid {info['parts']['valid']['tokens']:,}) in "
          f"{cap['seconds']:.1f} s; stopped by {cap['stopped_by']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
