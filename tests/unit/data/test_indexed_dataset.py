"""Megatron mmap format: files built here byte by byte from the spec (docs/reference-format.md §7) against the
writer and the reader, and every corruption the reader must name."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from kerple.data.errors import DataError
from kerple.data.indexed_dataset import IndexedDatasetWriter, MMapIndexedDataset

DOCUMENTS = [[5, 17, 65535, 0], [9], [300, 301, 302, 303, 304, 305, 306], [42, 43]]


def spec_files(prefix: Path, documents: list[list[int]], code: int = 8, fmt: str = "H",
               magic: bytes = b"MMIDIDX\x00\x00", version: int = 1,
               doc_idx: list[int] | None = None) -> tuple[bytes, bytes]:
    """The .idx/.bin bytes of ``documents`` written straight from the format description."""
    itemsize = struct.calcsize("<" + fmt)
    data = b"".join(struct.pack(f"<{len(doc)}{fmt}", *doc) for doc in documents)
    sizes = [len(doc) for doc in documents]
    pointers, position = [], 0
    for size in sizes:
        pointers.append(position)
        position += size * itemsize
    doc_idx = list(range(len(documents) + 1)) if doc_idx is None else doc_idx
    index = magic + struct.pack("<Q", version) + struct.pack("<B", code)
    index += struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx))
    index += struct.pack(f"<{len(sizes)}i", *sizes)
    index += struct.pack(f"<{len(pointers)}q", *pointers)
    index += struct.pack(f"<{len(doc_idx)}q", *doc_idx)
    Path(f"{prefix}.idx").write_bytes(index)
    Path(f"{prefix}.bin").write_bytes(data)
    return index, data


def test_writer_output_equals_spec_bytes(tmp_path: Path) -> None:
    spec_index, spec_data = spec_files(tmp_path / "spec", DOCUMENTS)
    with IndexedDatasetWriter(tmp_path / "ours", np.uint16) as writer:
        for document in DOCUMENTS:
            writer.add_document(document)
        writer.finalize()
    assert (tmp_path / "ours.idx").read_bytes() == spec_index
    assert (tmp_path / "ours.bin").read_bytes() == spec_data


@pytest.mark.parametrize(("code", "fmt", "dtype"), [(8, "H", np.uint16), (4, "i", np.int32), (5, "q", np.int64)])
def test_reader_reads_spec_file(tmp_path: Path, code: int, fmt: str, dtype: type) -> None:
    documents = [[min(t, 65535) for t in doc] for doc in DOCUMENTS]
    spec_files(tmp_path / "spec", documents, code, fmt)
    dataset = MMapIndexedDataset(tmp_path / "spec")
    assert len(dataset) == len(documents)
    assert dataset.dtype == np.dtype(dtype)
    for index, document in enumerate(documents):
        assert dataset[index].tolist() == document
    assert dataset.get(2, offset=2, length=3).tolist() == [302, 303, 304]
    assert dataset.get(2, offset=5).tolist() == [305, 306]
    assert dataset.doc_idx.tolist() == [0, 1, 2, 3, 4]
    assert dataset.num_tokens == sum(map(len, documents))


def test_reads_a_merged_file_whose_doc_idx_is_only_the_start(tmp_path: Path) -> None:
    """GPT-NeoX's tools/datasets/merge_datasets.py never extends doc_idx: its files hold [0] for any item
    count, and GPT-NeoX trains on them (sampling reads items). They were refused here."""
    spec_files(tmp_path / "merged", DOCUMENTS, doc_idx=[0])
    dataset = MMapIndexedDataset(tmp_path / "merged")
    assert [dataset[i].tolist() for i in range(len(DOCUMENTS))] == DOCUMENTS and dataset.doc_idx.tolist() == [0]
    for bad in ([1, 4], [0, 5]):
        spec_files(tmp_path / "bad", DOCUMENTS, doc_idx=bad)
        with pytest.raises(DataError, match=r"bad\.idx: doc_idx must start at 0 and stay within the item count 4"):
            MMapIndexedDataset(tmp_path / "bad")


def test_round_trip_int32_large_ids(tmp_path: Path) -> None:
    documents = [[70000, 1, 2], [123456]]
    with IndexedDatasetWriter(tmp_path / "big", np.int32) as writer:
        for document in documents:
            writer.add_document(np.array(document))
        writer.finalize()
    dataset = MMapIndexedDataset(tmp_path / "big")
    assert [dataset[i].tolist() for i in range(2)] == documents


def test_writer_rejects_ids_outside_dtype(tmp_path: Path) -> None:
    with IndexedDatasetWriter(tmp_path / "x", np.uint16) as writer, pytest.raises(DataError, match="out of range"):
        writer.add_document([70000])
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(tmp_path / "partial", np.uint16) as writer:
            writer.add_document([1, 2, 3])
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def _corrupt(tmp_path: Path, **kwargs: object) -> Path:
    spec_files(tmp_path / "bad", DOCUMENTS, **kwargs)  # type: ignore[arg-type]
    return tmp_path / "bad"


def test_wrong_magic(tmp_path: Path) -> None:
    prefix = _corrupt(tmp_path, magic=b"TNTIDX\x00\x00\x00")
    with pytest.raises(DataError, match=r"bad\.idx: wrong magic"):
        MMapIndexedDataset(prefix)


def test_wrong_version(tmp_path: Path) -> None:
    prefix = _corrupt(tmp_path, version=2)
    with pytest.raises(DataError, match=r"bad\.idx: unsupported index version 2"):
        MMapIndexedDataset(prefix)


def test_unknown_dtype_code(tmp_path: Path) -> None:
    prefix = _corrupt(tmp_path, code=9)
    with pytest.raises(DataError, match=r"bad\.idx: unknown dtype code 9"):
        MMapIndexedDataset(prefix)


def test_truncated_bin(tmp_path: Path) -> None:
    prefix = _corrupt(tmp_path)
    data = Path(f"{prefix}.bin").read_bytes()
    Path(f"{prefix}.bin").write_bytes(data[:-3])
    with pytest.raises(DataError, match=r"bad\.bin: truncated: 25 bytes, .*copy both files again, or prepare the "
                                        r"dataset again \(prepare_data\.py\)$"):
        MMapIndexedDataset(prefix)


def test_sizes_do_not_match_bin(tmp_path: Path) -> None:
    prefix = _corrupt(tmp_path)
    with open(f"{prefix}.bin", "ab") as handle:
        handle.write(b"\x00\x00")
    with pytest.raises(DataError, match=r"bad\.bin: 30 bytes, but the sizes in bad\.idx account for only 28 .*"
                                        r"damaged or mismatched: an interrupted copy\? copy both files again, "
                                        r"or prepare the dataset again \(prepare_data\.py\)$"):
        MMapIndexedDataset(prefix)


def test_an_index_of_another_dtype_is_named_as_such(tmp_path: Path) -> None:
    """A uint16 .bin (14 tokens, 28 bytes) under an .idx saying int32 was reported only as "truncated"."""
    _corrupt(tmp_path)
    spec_files(tmp_path / "int32", DOCUMENTS, code=4, fmt="I")
    Path(tmp_path / "int32.bin").write_bytes(Path(tmp_path / "bad.bin").read_bytes())
    with pytest.raises(DataError) as raised:
        MMapIndexedDataset(tmp_path / "int32")
    assert str(raised.value) == (
        f"{tmp_path}/int32.bin: truncated: 28 bytes, but the sizes in int32.idx need 56 (14 tokens of int32); that is "
        "exactly 14 tokens of 2 bytes, so int32.idx (dtype code 4, int32) was written for another .bin or with another "
        "dtype; use the .idx written with this .bin, or prepare the dataset again (prepare_data.py)")


def test_index_length_disagrees_with_header(tmp_path: Path) -> None:
    prefix = _corrupt(tmp_path)
    index = Path(f"{prefix}.idx").read_bytes()
    Path(f"{prefix}.idx").write_bytes(index[:-8])
    with pytest.raises(DataError, match=r"bad\.idx: index is .* bytes"):
        MMapIndexedDataset(prefix)


def test_short_index_and_missing_files(tmp_path: Path) -> None:
    Path(tmp_path / "short.idx").write_bytes(b"MMID")
    Path(tmp_path / "short.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"short\.idx: too short"):
        MMapIndexedDataset(tmp_path / "short")
    with pytest.raises(DataError, match=r"nothing\.idx: indexed-dataset file not found"):
        MMapIndexedDataset(tmp_path / "nothing")
    _corrupt(tmp_path)
    Path(tmp_path / "bad.bin").unlink()
    with pytest.raises(DataError, match=r"bad\.bin: indexed-dataset file not found"):
        MMapIndexedDataset(tmp_path / "bad")
