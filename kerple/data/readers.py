"""Reading documents from local files: JSON lines and plain text, optionally .gz/.xz/.bz2/.zst.

Bytes that are not UTF-8 are replaced by U+FFFD and counted in ``ReadStats.replaced_bytes`` so
the run can report them.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from kerple.data.errors import DataError

COMPRESSIONS = (".gz", ".xz", ".bz2", ".zst")


@dataclass
class ReadStats:
    """Counters filled while documents are read."""

    files: int = 0
    documents: int = 0
    replaced_bytes: int = 0
    files_with_replacements: list[str] = field(default_factory=list)
    text_bytes: int = 0  # UTF-8 size of the documents read (a replaced byte counts 3, as U+FFFD)

    @property
    def invalid_share(self) -> float:
        """The share of the input bytes that were not UTF-8 (each became one U+FFFD of 3 bytes)."""
        read = self.text_bytes - 2 * self.replaced_bytes
        return self.replaced_bytes / read if read > 0 else 0.0


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def decode_utf8_counting(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing each byte that is not valid UTF-8 with U+FFFD; return (text, count)."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    escaped = data.decode("utf-8", errors="surrogateescape")
    return _ESCAPED_BYTE.subn("\ufffd", escaped)


def open_binary(path: str | Path) -> BinaryIO:
    """Open a file for reading bytes, decompressing by suffix (.gz, .xz, .bz2, .zst)."""
    source = Path(path)
    if not source.is_file():
        raise DataError(f"{source}: input file not found")
    suffix = source.suffix.lower()
    try:
        if suffix == ".gz":
            return gzip.open(source, "rb")  # type: ignore[return-value]
        if suffix == ".xz":
            return lzma.open(source, "rb")  # type: ignore[return-value]
        if suffix == ".bz2":
            return bz2.open(source, "rb")  # type: ignore[return-value]
        if suffix == ".zst":
            import zstandard

            raw = open(source, "rb")
            reader = zstandard.ZstdDecompressor(max_window_size=2**31).stream_reader(raw, closefd=True)
            return io.BufferedReader(reader)  # type: ignore[arg-type]
        return open(source, "rb")
    except OSError as error:
        raise DataError(f"{source}: cannot open ({error})") from error


def read_file_bytes(path: str | Path) -> bytes:
    """All (decompressed) bytes of a file, with errors naming it."""
    try:
        with open_binary(path) as handle:
            return handle.read()
    except (OSError, EOFError, lzma.LZMAError) as error:
        raise DataError(f"{path}: cannot read ({error})") from error
    except Exception as error:  # zstandard.ZstdError has no common base besides Exception
        if type(error).__name__ == "ZstdError":
            raise DataError(f"{path}: corrupt zstd data ({error})") from error
        raise


def is_jsonl(path: str | Path) -> bool:
    """True for ``.jsonl``/``.json``/``.ndjson`` names, compressed or not."""
    name = Path(path).name.lower()
    for compression in COMPRESSIONS:
        if name.endswith(compression):
            name = name[: -len(compression)]
    return name.endswith((".jsonl", ".ndjson", ".json"))


def iter_jsonl(path: str | Path, key: str, stats: ReadStats) -> Iterator[str]:
    """The ``key`` field of each JSON line of a (compressed) file, streamed."""
    try:
        with open_binary(path) as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                text, replaced = decode_utf8_counting(line)
                _count_replacements(stats, path, replaced)
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}:{line_number}: not valid JSON ({error.msg})") from error
                if not isinstance(record, dict) or key not in record:
                    raise DataError(f"{path}:{line_number}: no {key!r} field (use --jsonl-keys)")
                value = record[key]
                if not isinstance(value, str):
                    raise DataError(f"{path}:{line_number}: field {key!r} is not a string")
                stats.documents += 1
                yield value
    except (OSError, EOFError, lzma.LZMAError) as error:
        raise DataError(f"{path}: cannot read ({error})") from error


def _count_replacements(stats: ReadStats, path: str | Path, replaced: int) -> None:
    if replaced:
        stats.replaced_bytes += replaced
        if len(stats.files_with_replacements) < 20 and str(path) not in stats.files_with_replacements:
            stats.files_with_replacements.append(str(path))


def read_text_document(path: str | Path, stats: ReadStats) -> str:
    """A whole (compressed) text file as one document."""
    text, replaced = decode_utf8_counting(read_file_bytes(path))
    _count_replacements(stats, path, replaced)
    stats.documents += 1
    return text


def iter_input_files(paths: Sequence[str | Path], jsonl_key: str, stats: ReadStats) -> Iterator[str]:
    """Documents of user input files in order: one per JSON line, or one per plain text file.

    Every path is checked before reading starts, so a typo fails before any work is done.
    """
    missing = [str(path) for path in paths if not Path(path).is_file()]
    if missing:
        raise DataError("input file not found: " + ", ".join(missing))
    for path in paths:
        stats.files += 1
        if is_jsonl(path):
            yield from iter_jsonl(path, jsonl_key, stats)
        else:
            yield read_text_document(path, stats)
