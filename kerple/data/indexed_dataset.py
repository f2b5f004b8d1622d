"""Megatron "mmap" indexed dataset: a streaming writer and a validating, memory-mapped reader.

Format (docs/reference-format.md §7, little-endian), byte-compatible with GPT-NeoX / Megatron-LM files:

``<prefix>.idx``::

    magic     9 bytes  b"MMIDIDX\\x00\\x00"
    version   u64      1
    dtype     u8       code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float32, 7 float64, 8 uint16)
    count     u64      number of items (one per document here)
    doc_count u64      length of doc_idx (count + 1 when every document is one item)
    sizes     int32[count]      tokens per item
    pointers  int64[count]      byte offset of each item in the .bin
    doc_idx   int64[doc_count]  item index where each document starts, then the total

``<prefix>.bin``: the items' tokens, concatenated, in the dtype above.
"""

from __future__ import annotations

import array
import os
import struct
from pathlib import Path
from types import TracebackType

import numpy as np

from kerple.data.errors import DataError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, count, doc_count: 34 bytes
REPAIR = "an interrupted copy? copy both files again, or prepare the dataset again (prepare_data.py)"

DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float32,
    7: np.float64,
    8: np.uint16,
}


def dtype_code(dtype: np.dtype | type) -> int:
    """The format's code for a numpy dtype (raises ``DataError`` for one the format lacks)."""
    wanted = np.dtype(dtype)
    for code, candidate in DTYPE_CODES.items():
        if np.dtype(candidate) == wanted:
            return code
    raise DataError(f"dtype {wanted} has no code in the mmap indexed-dataset format")


def best_fitting_dtype(vocab_size: int | None) -> type[np.generic]:
    """uint16 when every id of the vocabulary fits under 65500 (the reference's rule), else int32."""
    if vocab_size is not None and vocab_size < 65500:
        return np.uint16
    return np.int32


def index_path(prefix: str | Path) -> Path:
    """``<prefix>.idx``."""
    return Path(f"{prefix}.idx")


def data_path(prefix: str | Path) -> Path:
    """``<prefix>.bin``."""
    return Path(f"{prefix}.bin")


def dataset_exists(prefix: str | Path) -> bool:
    """True when both files of the dataset exist (validity is checked by opening it)."""
    return index_path(prefix).is_file() and data_path(prefix).is_file()


class IndexedDatasetWriter:
    """Streams documents into ``<prefix>.bin/.idx`` under temporary names; renames on ``finalize``.

    Memory grows only with the number of documents (4 bytes each), never with their length.
    Used as a context manager, an exception (or leaving without ``finalize``) removes the
    temporary files, so a failed run leaves neither partial nor stale-looking output.
    """

    def __init__(self, prefix: str | Path, dtype: type[np.generic] = np.uint16) -> None:
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        self._code = dtype_code(self.dtype)
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        suffix = f".tmp{os.getpid()}"
        self._bin_final = data_path(self.prefix)
        self._idx_final = index_path(self.prefix)
        self._bin_tmp = Path(f"{self._bin_final}{suffix}")
        self._idx_tmp = Path(f"{self._idx_final}{suffix}")
        self._bin = open(self._bin_tmp, "wb")
        self._sizes = array.array("i")
        self.num_tokens = 0
        self._done = False

    def add_document(self, tokens: np.ndarray | list[int]) -> None:
        """Append one document as one item (and close it as a document)."""
        as_array = np.asarray(tokens)
        if as_array.ndim != 1:
            raise ValueError(f"a document must be a 1-D token array, got shape {as_array.shape}")
        if as_array.size and self.dtype.kind in "ui":
            info = np.iinfo(self.dtype)
            if as_array.min() < info.min or as_array.max() > info.max:
                raise DataError(
                    f"{self._bin_final}: token id out of range for {self.dtype} "
                    f"(min {as_array.min()}, max {as_array.max()})"
                )
        self._bin.write(as_array.astype(self.dtype, copy=False).tobytes(order="C"))
        self._sizes.append(int(as_array.size))
        self.num_tokens += int(as_array.size)

    @property
    def num_documents(self) -> int:
        """Documents added so far."""
        return len(self._sizes)

    def finalize(self) -> None:
        """Write the index and move both files to their final names (.bin first, then .idx)."""
        self._bin.close()
        sizes = np.frombuffer(self._sizes, dtype=np.int32) if self._sizes else np.zeros(0, np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
        with open(self._idx_tmp, "wb") as index:
            index.write(HEADER.pack(MAGIC, VERSION, self._code, len(sizes), len(doc_idx)))
            index.write(sizes.tobytes(order="C"))
            index.write(pointers.tobytes(order="C"))
            index.write(doc_idx.tobytes(order="C"))
        os.replace(self._bin_tmp, self._bin_final)
        os.replace(self._idx_tmp, self._idx_final)
        self._done = True

    def abort(self) -> None:
        """Close and delete the temporary files (no effect after ``finalize``)."""
        if self._done:
            return
        self._bin.close()
        for temporary in (self._bin_tmp, self._idx_tmp):
            temporary.unlink(missing_ok=True)
        self._done = True

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()


def _mismatch_fix(nbytes: int, tokens: int, dtype: np.dtype, idx_name: str) -> str:
    """What a .bin whose size disagrees with its index most likely is, and the fix."""
    fits = sorted({np.dtype(other).itemsize for other in DTYPE_CODES.values()} - {dtype.itemsize})
    other = next((size for size in fits if tokens and nbytes == tokens * size), None)
    if other is not None:
        return (f"that is exactly {tokens} tokens of {other} bytes, so {idx_name} (dtype code {dtype_code(dtype)}, "
                f"{dtype}) was written for another .bin or with another dtype; use the .idx written with this "
                ".bin, or prepare the dataset again (prepare_data.py)")
    return f"the pair is damaged or mismatched: {REPAIR}"


class MMapIndexedDataset:
    """Reads a Megatron mmap dataset after checking the index against the format and the .bin size.

    ``dataset[i]`` is item ``i`` as a numpy array; ``get(i, offset, length)`` a slice of it without
    copying the rest. ``sizes``, ``pointers`` and ``doc_idx`` are the index arrays.
    """

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        idx_file, bin_file = index_path(prefix), data_path(prefix)
        for required in (idx_file, bin_file):
            if not required.is_file():
                raise DataError(f"{required}: indexed-dataset file not found (prefix {prefix})")
        raw = np.memmap(idx_file, mode="r", dtype=np.uint8) if idx_file.stat().st_size else None
        if raw is None or len(raw) < HEADER.size:
            raise DataError(f"{idx_file}: too short for an mmap index header ({HEADER.size} bytes); {REPAIR}")
        magic, version, code, count, doc_count = HEADER.unpack(bytes(raw[: HEADER.size]))
        if magic != MAGIC:
            raise DataError(
                f"{idx_file}: wrong magic {magic!r}, expected {MAGIC!r} (not a Megatron mmap index; "
                "the older 'lazy'/'cached' index formats are not supported)"
            )
        if version != VERSION:
            raise DataError(f"{idx_file}: unsupported index version {version}, expected {VERSION}")
        if code not in DTYPE_CODES:
            raise DataError(f"{idx_file}: unknown dtype code {code} (valid: {sorted(DTYPE_CODES)})")
        self.dtype = np.dtype(DTYPE_CODES[code])
        expected = HEADER.size + count * 4 + count * 8 + doc_count * 8
        if len(raw) != expected:
            raise DataError(
                f"{idx_file}: index is {len(raw)} bytes but its header (count {count}, "
                f"doc_count {doc_count}) implies {expected}; {REPAIR}"
            )
        offset = HEADER.size
        self.sizes = np.frombuffer(raw, dtype=np.int32, count=count, offset=offset)
        offset += self.sizes.nbytes
        self.pointers = np.frombuffer(raw, dtype=np.int64, count=count, offset=offset)
        offset += self.pointers.nbytes
        self.doc_idx = np.frombuffer(raw, dtype=np.int64, count=doc_count, offset=offset)
        self._validate(idx_file, bin_file)
        nbytes = bin_file.stat().st_size
        self._bin = (
            np.memmap(bin_file, mode="r", dtype=np.uint8) if nbytes else np.zeros(0, np.uint8)
        )

    def _validate(self, idx_file: Path, bin_file: Path) -> None:
        """Sizes, pointers and doc_idx must describe exactly the bytes of the .bin."""
        itemsize = self.dtype.itemsize
        if len(self.sizes) and int(self.sizes.min()) < 0:
            raise DataError(f"{idx_file}: negative item size in the index")
        nbytes = bin_file.stat().st_size
        tokens = int(self.sizes.astype(np.int64).sum())
        expected = tokens * itemsize
        if nbytes != expected:
            found = (f"truncated: {nbytes} bytes, but the sizes in {idx_file.name} need {expected}" if nbytes < expected
                     else f"{nbytes} bytes, but the sizes in {idx_file.name} account for only {expected}")
            raise DataError(f"{bin_file}: {found} ({tokens} tokens of {self.dtype}); "
                            + _mismatch_fix(nbytes, tokens, self.dtype, idx_file.name))
        if len(self.sizes):
            ends = self.pointers + self.sizes.astype(np.int64) * itemsize
            if int(self.pointers.min()) < 0 or int(ends.max()) > nbytes:
                raise DataError(f"{idx_file}: item pointers reach outside {bin_file.name}")
        # GPT2Dataset samples items, never documents; GPT-NeoX's merge_datasets.py writes doc_idx [0]
        # for any item count, and GPT-NeoX reads such files, so doc_idx need not end at the count
        doc_idx = self.doc_idx
        if len(doc_idx) == 0 or doc_idx[0] != 0 or int(doc_idx.max()) > len(self.sizes):
            raise DataError(
                f"{idx_file}: doc_idx must start at 0 and stay within the item count {len(self.sizes)}"
            )
        if len(doc_idx) > 1 and bool((np.diff(doc_idx) < 0).any()):
            raise DataError(f"{idx_file}: doc_idx is not non-decreasing")

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def num_tokens(self) -> int:
        """Total tokens of all items."""
        return int(self.sizes.astype(np.int64).sum())

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``offset : offset + length`` of item ``index`` (to its end when length is None)."""
        size = int(self.sizes[index])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"slice [{offset}, {offset + length}) outside item {index} of {size}")
        start = int(self.pointers[index]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=start)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.get(int(index))
