"""Separate data paths and their blending, against GPT-NeoX's rule worked by hand (docs/data.md):
each dataset gets ceil(num_samples * weight * 1.005) samples and is named ``<split>_<i>``; blended
sample n comes from the dataset whose share lags most behind its weight."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kerple.config import load_config
from kerple.config.errors import ConfigError
from kerple.data.blending import blend_num_samples, blending_indices
from kerple.data.gpt2_dataset import build_datasets_from_config
from kerple.data.indexed_dataset import IndexedDatasetWriter, MMapIndexedDataset
from tests.unit.data.test_gpt2_dataset import reference_maps


def write_corpus(prefix: Path, sizes: list[int], first_token: int) -> list[np.ndarray]:
    documents = [np.arange(first_token + 100 * i, first_token + 100 * i + size) for i, size in enumerate(sizes)]
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for document in documents:
            writer.add_document(document)
        writer.finalize()
    return documents


def reference_sample(prefix: Path, num_samples: int, seq_length: int, seed: int, index: int) -> np.ndarray:
    """Sample ``index`` of GPT-NeoX's ``GPT2Dataset`` over every document of ``prefix``."""
    indexed = MMapIndexedDataset(prefix)
    documents = np.arange(len(indexed), dtype=np.int32)
    doc_idx, sample_idx, shuffle_idx = reference_maps(documents, indexed.sizes, num_samples, seq_length, seed)
    stream = np.concatenate([indexed[int(d)] for d in doc_idx]).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(indexed.sizes[doc_idx])])
    position, offset = sample_idx[int(shuffle_idx[index])]
    start = int(starts[position] + offset)
    return stream[start:start + seq_length + 1]


def config(train: list[str], weights: list[float] | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        data=SimpleNamespace(train_data_paths=train, train_data_weights=weights, seq_length_val=None),
        model=SimpleNamespace(seq_length=16), training=SimpleNamespace(seed=5),
        provenance=lambda ident: ("test", ident),
    )


def test_sample_counts_follow_the_weights_with_the_half_percent_margin() -> None:
    assert blend_num_samples([1.0], 20) == ([1.0], [21])  # 20.1 -> 21
    assert blend_num_samples([1, 2, 1], 100) == ([0.25, 0.5, 0.25], [26, 51, 26])  # 25.125, 50.25, 25.125
    assert blend_num_samples([3, 1], 40)[1] == [31, 11]  # 30.15, 10.05


def test_blending_order_worked_by_hand() -> None:
    # weights 1/4, 3/4: errors w*max(n,1) - taken; n=4 ties (0 and 0) and takes the first dataset
    dataset_index, sample_index = blending_indices([0.25, 0.75], 8)
    assert dataset_index.tolist() == [1, 0, 1, 1, 0, 1, 1, 1]
    assert sample_index.tolist() == [0, 0, 1, 2, 1, 3, 4, 5]
    assert dataset_index.dtype == np.uint8 and sample_index.dtype == np.int64


def test_every_prefix_of_the_blend_keeps_each_share_within_one_sample() -> None:
    weights = [0.2, 0.3, 0.5]
    dataset_index, _ = blending_indices(weights, 3000)
    for n in (10, 99, 1000, 3000):
        counts = np.bincount(dataset_index[:n], minlength=3)
        assert np.all(np.abs(counts - np.array(weights) * n) <= 1), (n, counts)


def test_one_path_builds_the_references_dataset_train_0(tmp_path: Path) -> None:
    """20 samples of 16 tokens fit one epoch of 321 tokens, but GPT-NeoX builds 21 (20 x 1.005, rounded
    up), hence two epochs and another shuffle. The old code built 20 under the name "train"."""
    prefix = tmp_path / "one_text_document"
    write_corpus(prefix, [100, 121, 100], first_token=1)
    built = build_datasets_from_config(config([str(prefix)]), (20, 0, 0))
    names = sorted(path.name for path in tmp_path.glob("*.npy"))
    assert names == [f"one_text_document_train_0_indexmap_21ns_16sl_5s_{kind}.npy"
                     for kind in ("doc_idx", "sample_idx", "shuffle_idx")]
    assert built.train is not None and len(built.train.datasets[0].doc_idx) == 6  # two epochs of 3 documents
    for index in range(20):
        np.testing.assert_array_equal(built.train[index]["text"], reference_sample(prefix, 21, 16, 5, index))


def test_two_paths_are_blended_by_their_weights(tmp_path: Path) -> None:
    first, second = tmp_path / "a_text_document", tmp_path / "b_text_document"
    write_corpus(first, [30, 50, 40], first_token=1)
    write_corpus(second, [60, 45, 70, 25], first_token=20000)
    built = build_datasets_from_config(config([str(first), str(second)], [1, 3]), (40, 0, 0))
    assert {path.name for path in tmp_path.glob("*_doc_idx.npy")} == {
        "a_text_document_train_0_indexmap_11ns_16sl_5s_doc_idx.npy",  # 40 x 1/4 x 1.005 = 10.05
        "b_text_document_train_1_indexmap_31ns_16sl_5s_doc_idx.npy",  # 40 x 3/4 x 1.005 = 30.15
    }
    order, within = blending_indices([0.25, 0.75], 40)
    taken = [0, 0]
    for index in range(40):
        source, count = (first, 11) if order[index] == 0 else (second, 31)
        expected = reference_sample(source, count, 16, 5, taken[order[index]])
        taken[order[index]] += 1
        np.testing.assert_array_equal(built.train[index]["text"], expected)  # type: ignore[index]
    assert taken == [10, 30]
    assert built.valid is None and built.test is None


def test_weights_must_match_the_paths_when_the_config_loads() -> None:
    with pytest.raises(ConfigError, match=r"train_data_weights \[1\.0, 3\.0\]: one non-negative weight per "
                                          r"train_data_paths entry \(1\)"):
        load_config([], {"train_data_paths": ["a"], "train_data_weights": [1, 3]})
    cfg = load_config([], {"train_data_paths": ["a", "b"], "valid_data_paths": ["c"], "valid_data_weights": [2]})
    assert cfg.data.train_data_weights is None and cfg.data.valid_data_weights == [2.0]
