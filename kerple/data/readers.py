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
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from kerple.data.errors import DataError

COMPRESSIONS = (".gz", ".xz", ".bz2", ".zst")
COMPRESSION_NAMES = {".gz": "gzip", ".xz": "xz", ".bz2": "bz2", ".zst": "zstd"}


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


class ZstdReader(io.RawIOBase):
    """The decompressed bytes of a ``.zst`` stream of one or more frames. A stream that ends
    inside a frame raises ``EOFError``, as gzip, xz and bz2 do (zstandard's own stream reader
    ends quietly there, so a truncated file would read as a shorter corpus)."""

    def __init__(self, raw: BinaryIO) -> None:
        import zstandard

        super().__init__()
        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor(max_window_size=2**31)
        self._frame: Any = None  # the decompressor of the current frame
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            chunk = self._raw.read(1 << 20)
            if not chunk:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("the file ends inside a zstd frame")
                return 0
            self._pending = memoryview(self._decode(chunk))
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count

    def _decode(self, data: bytes) -> bytes:
        output = []
        while data:
            if self._frame is None or self._frame.eof:
                self._frame = self._decompressor.decompressobj()
            output.append(self._frame.decompress(data))
            data = self._frame.unused_data if self._frame.eof else b""
        return b"".join(output)

    def close(self) -> None:
        self._raw.close()
        super().close()


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
            return io.BufferedReader(ZstdReader(open(source, "rb")), buffer_size=1 << 20)
        return open(source, "rb")
    except OSError as error:
        raise DataError(f"{source}: cannot open ({error})") from error


def _decompression_errors() -> tuple[type[BaseException], ...]:
    """What the decompressors raise on damaged data: gzip's ``BadGzipFile`` and bz2's "Invalid
    data stream" are ``OSError`` without an errno, a cut-off stream is ``EOFError``."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError)
    try:
        import zstandard
    except ImportError:
        return errors
    return (*errors, zstandard.ZstdError)


@contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Turn a failure while reading ``path`` into a :class:`DataError` naming it: damaged
    compressed data is "corrupt or truncated <format> data", other failures "cannot read"."""
    try:
        yield
    except DataError:
        raise
    except _decompression_errors() as error:
        kind = COMPRESSION_NAMES.get(Path(path).suffix.lower())
        if kind and not (isinstance(error, OSError) and error.errno is not None):
            raise DataError(f"{path}: corrupt or truncated {kind} data ({error}); "
                            "fetch the file again or recompress it") from None
        raise DataError(f"{path}: cannot read ({error})") from None


def read_file_bytes(path: str | Path) -> bytes:
    """All (decompressed) bytes of a file, with errors naming it."""
    with reading(path), open_binary(path) as handle:
        return handle.read()


def is_jsonl(path: str | Path) -> bool:
    """True for ``.jsonl``/``.json``/``.ndjson`` names, compressed or not."""
    name = Path(path).name.lower()
    for compression in COMPRESSIONS:
        if name.endswith(compression):
            name = name[: -len(compression)]
    return name.endswith((".jsonl", ".ndjson", ".json"))


def iter_jsonl(path: str | Path, key: str, stats: ReadStats, also: Sequence[str] = ()) -> Iterator[str]:
    """The ``key`` field of each JSON line of a (compressed) file, streamed; every line must also hold
    the string fields ``also`` (the other keys of a run that reads several, checked in its first pass)."""
    with reading(path), open_binary(path) as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            text, replaced = decode_utf8_counting(line)
            _count_replacements(stats, path, replaced)
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{line_number}: not valid JSON ({error.msg})") from error
            for field in (key, *also):
                if not isinstance(record, dict) or field not in record:
                    raise DataError(f"{path}:{line_number}: no {field!r} field (use --jsonl-keys)")
                if not isinstance(record[field], str):
                    raise DataError(f"{path}:{line_number}: field {field!r} is not a string")
            stats.documents += 1
            yield record[key]


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


def iter_input_files(paths: Sequence[str | Path], jsonl_key: str, stats: ReadStats,
                     also: Sequence[str] = ()) -> Iterator[str]:
    """Documents of user input files in order: one per JSON line (its ``jsonl_key`` field; the fields
    ``also`` must be there too), or one per plain text file.

    Every path is checked before reading starts, so a typo fails before any work is done.
    """
    missing = [str(path) for path in paths if not Path(path).is_file()]
    if missing:
        raise DataError("input file not found: " + ", ".join(missing))
    for path in paths:
        stats.files += 1
        if is_jsonl(path):
            yield from iter_jsonl(path, jsonl_key, stats, also)
        else:
            yield read_text_document(path, stats)
