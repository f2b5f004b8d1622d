"""GPT2Dataset sampling against a literal, loop-by-loop restatement of the reference algorithm."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kerple.data.errors import DataError
from kerple.data.gpt2_dataset import (
    GPT2Dataset,
    build_datasets_from_config,
    build_train_valid_test_datasets,
    num_epochs_needed,
    split_boundaries,
)
from kerple.data.indexed_dataset import IndexedDatasetWriter, MMapIndexedDataset


def reference_split(split: str, size: int) -> list[int]:
    weights = [float(s) for s in split.split(",")]
    while len(weights) < 3:
        weights.append(0.0)
    weights = [w / sum(weights) for w in weights[:3]]
    index = [0]
    for i, w in enumerate(weights):
        index.append(index[i] + int(round(w * float(size))))
    diff = index[-1] - size
    for i in range(1, len(index)):
        index[i] -= diff
    return index


def reference_maps(documents: np.ndarray, sizes: np.ndarray, num_samples: int, seq_length: int,
                   seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference's order: epochs, RNG, doc_idx shuffle, the sample walk, the sample shuffle."""
    tokens_per_epoch = int(np.sum(sizes[documents]))
    num_epochs, total = 0, 0
    while True:
        num_epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_length >= num_samples:
            break
    rng = np.random.RandomState(seed=seed)
    doc_idx = np.mgrid[0:num_epochs, 0:len(documents)][1]
    doc_idx[:] = documents
    doc_idx = doc_idx.reshape(-1).astype(np.int32)
    rng.shuffle(doc_idx)
    n = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = np.zeros((n + 1, 2), dtype=np.int32)
    sample_index, doc_idx_index, doc_offset = 1, 0, 0
    while sample_index <= n:
        remaining = seq_length + 1
        while remaining != 0:
            doc_length = int(sizes[doc_idx[doc_idx_index]]) - doc_offset
            remaining -= doc_length
            if remaining <= 0:
                doc_offset += remaining + doc_length - 1
                remaining = 0
            else:
                doc_idx_index += 1
                doc_offset = 0
        sample_idx[sample_index] = (doc_idx_index, doc_offset)
        sample_index += 1
    shuffle_idx = np.arange(n, dtype=np.uint32)
    rng.shuffle(shuffle_idx)
    return doc_idx, sample_idx, shuffle_idx


def make_corpus(tmp_path: Path, sizes: list[int], seed: int = 0) -> tuple[Path, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    documents = [rng.integers(1, 50000, size=size) for size in sizes]
    prefix = tmp_path / "corpus_text_document"
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for document in documents:
            writer.add_document(document)
        writer.finalize()
    return prefix, documents


@pytest.mark.parametrize(("split", "size", "bounds"), [
    ("969,30,1", 1000, [0, 969, 999, 1000]),
    ("969,30,1", 7, [0, 7, 7, 7]),  # 6.783 -> 7, 0.21 -> 0, 0.007 -> 0
    ("100,0,0", 5, [0, 5, 5, 5]),
    ("2,1,1", 10, [0, 6, 8, 10]),  # 5, 2.5 -> 2, 2.5 -> 2 (round half to even) sum to 9: every bound moves up 1
    ("1,1,1", 10, [0, 4, 7, 10]),  # 3.33 -> 3 three times sum to 9: every bound moves up 1
])
def test_split_boundaries_hand_computed(split: str, size: int, bounds: list[int]) -> None:
    assert split_boundaries(split, size) == bounds


@pytest.mark.parametrize("split", ["949,50,1", "969, 30, 1", "1,1,1", "100", "90,10", "7,0,3"])
@pytest.mark.parametrize("size", [1, 3, 10, 249, 1762])
def test_split_boundaries_match_reference(split: str, size: int) -> None:
    assert split_boundaries(split, size) == reference_split(split.replace(" ", ""), size)


@pytest.mark.parametrize(("seq_length", "num_samples", "seed"), [(8, 40, 1234), (16, 7, 0), (5, 200, 99)])
def test_index_maps_and_samples_match_reference(tmp_path: Path, seq_length: int, num_samples: int,
                                                seed: int) -> None:
    sizes = [13, 1, 40, 7, 8, 9, 22, 3, 17, 2, 30, 6]
    prefix, documents = make_corpus(tmp_path, sizes)
    indexed = MMapIndexedDataset(prefix)
    docs = np.arange(2, 11, dtype=np.int32)
    dataset = GPT2Dataset("train", prefix, docs, indexed, num_samples, seq_length, seed)
    expected = reference_maps(docs, indexed.sizes, num_samples, seq_length, seed)
    for ours, theirs in zip((dataset.doc_idx, dataset.sample_idx, dataset.shuffle_idx), expected):
        np.testing.assert_array_equal(np.asarray(ours), theirs)
        assert np.asarray(ours).dtype == theirs.dtype
    assert len(dataset) >= num_samples
    for index in range(len(dataset)):
        shuffled = int(expected[2][index])
        stream = np.concatenate([documents[d] for d in expected[0]])
        doc_starts = np.concatenate([[0], np.cumsum([sizes[d] for d in expected[0]])])
        position_in_doc, offset = expected[1][shuffled]
        start = doc_starts[position_in_doc] + offset
        item = dataset[index]
        np.testing.assert_array_equal(item["text"], stream[start:start + seq_length + 1])
        np.testing.assert_array_equal(item["tokens"], item["text"][:-1])
        np.testing.assert_array_equal(item["labels"], item["text"][1:])


def test_the_tiled_order_holds_each_document_once_per_epoch_and_the_samples_tile_it(tmp_path: Path) -> None:
    """Worked without the reference's loop: 3 epochs of 5 documents (46 tokens each) make 138 tokens,
    (138 - 1) // 8 = 17 windows of 9 tokens; window k is tokens 8k ... 8k + 8 of the shuffled stream, so
    every token up to 136 is read, a boundary token twice, and the last token only starts no window."""
    sizes = [10, 3, 20, 6, 7]
    prefix, documents = make_corpus(tmp_path, sizes)
    indexed = MMapIndexedDataset(prefix)
    dataset = GPT2Dataset("train", prefix, np.arange(5, dtype=np.int32), indexed, 15, 8, 3, cache=False)
    assert len(dataset) == 17 and len(dataset.doc_idx) == 15
    assert np.bincount(np.asarray(dataset.doc_idx), minlength=5).tolist() == [3] * 5  # shuffled across epochs
    stream = np.concatenate([documents[d] for d in dataset.doc_idx])
    order = np.argsort(np.asarray(dataset.shuffle_idx))  # dataset position of window k
    for window in range(17):
        np.testing.assert_array_equal(dataset[int(order[window])]["text"], stream[8 * window: 8 * window + 9])
    assert sorted(np.asarray(dataset.shuffle_idx).tolist()) == list(range(17))


def test_empty_documents_follow_reference_walk(tmp_path: Path) -> None:
    sizes = [5, 0, 0, 4, 0, 6, 1, 0, 9]
    prefix, _ = make_corpus(tmp_path, sizes)
    indexed = MMapIndexedDataset(prefix)
    docs = np.arange(len(sizes), dtype=np.int32)
    for seq_length in (1, 2, 3, 4, 5):
        dataset = GPT2Dataset("train", prefix, docs, indexed, 30, seq_length, 7, cache=False)
        expected = reference_maps(docs, indexed.sizes, 30, seq_length, 7)
        np.testing.assert_array_equal(dataset.sample_idx[1:], expected[1][1:])


def test_index_maps_cached_with_reference_names(tmp_path: Path) -> None:
    prefix, _ = make_corpus(tmp_path, [50] * 20)
    built = build_train_valid_test_datasets(prefix, "949,50,1", (10, 3, 1), 16, 1234, seq_length_eval=32)
    assert built.train is not None and built.valid is not None and built.test is None
    names = sorted(p.name for p in tmp_path.glob("*.npy"))
    assert "corpus_text_document_train_indexmap_10ns_16sl_1234s_doc_idx.npy" in names
    assert "corpus_text_document_valid_indexmap_3ns_32sl_1234s_sample_idx.npy" in names
    assert len(names) == 6 and not list(tmp_path.glob("*.tmp*"))
    assert built.valid[0]["text"].shape == (33,)
    again = build_train_valid_test_datasets(prefix, "949,50,1", (10, 3, 1), 16, 1234, seq_length_eval=32)
    np.testing.assert_array_equal(again.train.shuffle_idx, built.train.shuffle_idx)  # type: ignore[union-attr]
    assert isinstance(again.train.shuffle_idx, np.memmap)  # type: ignore[union-attr]


def test_build_from_config_split_and_separate_paths(tmp_path: Path) -> None:
    prefix, _ = make_corpus(tmp_path, [40] * 30)
    cfg = SimpleNamespace(
        data=SimpleNamespace(data_path=str(prefix), split="80,10,10", seq_length_val=64),
        model=SimpleNamespace(seq_length=16), training=SimpleNamespace(seed=5),
    )
    built = build_datasets_from_config(cfg, (20, 4, 4), cache=False)
    assert built.train[0]["tokens"].shape == (16,)  # type: ignore[index]
    assert built.test[0]["tokens"].shape == (64,)  # type: ignore[index]
    cfg.data.valid_data_paths = [str(prefix)]
    cfg.data.train_data_paths = [str(prefix)]
    separate = build_datasets_from_config(cfg, (20, 4, 4), cache=False)
    assert separate.test is None and separate.valid[0]["text"].shape == (65,)  # type: ignore[index]


def test_a_missing_dataset_names_its_key_its_file_and_the_slip(tmp_path: Path) -> None:
    """The error named only the missing .idx file, not the key or config file that gave the prefix."""
    from kerple.config import load_config

    prefix, _ = make_corpus(tmp_path, [40] * 30)
    config = tmp_path / "mine.yml"
    for value, fix in [(tmp_path / "corpus", f"did you mean {prefix}?"),
                       (f"{prefix}.bin", f"give the prefix without the extension ({prefix})"),
                       (tmp_path / "other", "fix the path in the config, or prepare the data (prepare_data.py)")]:
        config.write_text(f"data-path: {value}\n")
        with pytest.raises(DataError) as error:
            build_datasets_from_config(load_config([config]), (20, 4, 0), cache=False)
        assert str(error.value) == f"data_path {value} ({config}): {value}.idx and {value}.bin not found; {fix}"
    with pytest.raises(DataError, match=r"^no config sets data_path \(or train_data_paths\): add a data config such as "
                                        r"configs/data/stdlib_bpe.yml \(its data from prepare_data.py\), or data_path=PREFIX$"):
        build_datasets_from_config(load_config([]), (20, 4, 0), cache=False)
    cfg = load_config([config], {"data_path": str(prefix), "valid_data_paths": [str(tmp_path / "gone")]})
    with pytest.raises(DataError, match=r"^valid_data_paths \S+gone \(<command line>\): \S+gone.idx and \S+gone.bin not found"):
        build_datasets_from_config(cfg, (0, 4, 0), cache=False)


def test_bad_split_string() -> None:
    with pytest.raises(DataError, match="split 'a,b'"):
        split_boundaries("a,b", 10)


def test_split_shorter_than_one_sample_is_refused(tmp_path: Path) -> None:
    prefix, _ = make_corpus(tmp_path, [3, 4])  # 7 tokens
    with pytest.raises(DataError) as raised:
        build_train_valid_test_datasets(prefix, "100", (10, 0, 0), 32, 1234)
    message = str(raised.value)
    assert message.startswith(f"{prefix}: the train split holds 7 tokens")
    assert "seq-length + 1 = 33" in message and "lower seq-length" in message
    assert not list(tmp_path.glob("*.npy"))  # no index map cached for a refused split


def test_split_of_exactly_one_sample_is_accepted(tmp_path: Path) -> None:
    prefix, documents = make_corpus(tmp_path, [20, 13])  # 33 tokens: one sample of 32 + 1
    built = build_train_valid_test_datasets(prefix, "100", (3, 0, 0), 32, 1234, cache=False)
    assert built.train is not None
    np.testing.assert_array_equal(built.train[0]["text"], np.concatenate(documents))
    with pytest.raises(DataError, match="holds 33 tokens, fewer than one sample of seq-length \\+ 1 = 34"):
        build_train_valid_test_datasets(prefix, "100", (3, 0, 0), 33, 1234, cache=False)


def test_short_valid_split_names_the_evaluation_length(tmp_path: Path) -> None:
    prefix, _ = make_corpus(tmp_path, [40] * 9 + [10])  # split "9,1": valid is the 10-token document
    with pytest.raises(DataError, match=r"the valid split holds 10 tokens, .* seq-length-val"):
        build_train_valid_test_datasets(prefix, "9,1", (4, 2, 0), 8, 1, seq_length_eval=16, cache=False)


def test_the_epoch_count_is_the_reference_loop_in_closed_form() -> None:
    rng = np.random.RandomState(0)
    for _ in range(500):
        tokens, seq_length, samples = (int(v) for v in rng.randint(1, 400, size=3))
        epochs = 1
        while (epochs * tokens - 1) // seq_length < samples:
            epochs += 1
        assert num_epochs_needed(tokens, seq_length, samples) == epochs
    assert num_epochs_needed(10, 512, 10**23) > 10**24  # at once: the loop ran for minutes on train_iters 1e23


def test_an_absurd_sample_count_is_refused_before_any_index_is_built(tmp_path: Path) -> None:
    prefix, _ = make_corpus(tmp_path, [300, 400])
    started = time.perf_counter()
    with pytest.raises(DataError) as raised:
        build_train_valid_test_datasets(prefix, "100", (10**12, 0, 0), 32, 1234)
    assert time.perf_counter() - started < 5
    message = str(raised.value)
    assert "the train split's sample index for 1,000,000,000,000 samples" in message and "lower train_iters" in message
    assert not list(tmp_path.glob("*.npy"))
