"""GPT-NeoX ``GPT2Dataset`` sampling: the same data, seed and lengths give the same samples.

Algorithm (docs/reference-format.md §7), restated:

1. the items of an indexed dataset are split into contiguous ranges by a ``split`` string
   ("949,50,1": weights of train, valid, test);
2. a range of ``documents`` is tiled for as many epochs as ``num_samples`` samples of
   ``seq_length + 1`` tokens need;
3. one ``numpy.random.RandomState(seed)`` shuffles the tiled document order (``doc_idx``), then
   the sample order (``shuffle_idx``), in that order;
4. ``sample_idx[i] = (position in doc_idx, token offset)`` where sample ``i`` starts; consecutive
   samples share one token (the last of a sample is the first of the next);
5. the three maps are cached as ``.npy`` files next to the data, under the reference's names, so
   files the reference wrote are reused and vice versa.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kerple.atomic import atomic_path
from kerple.data.blending import BlendedDataset, blend_num_samples
from kerple.data.errors import DataError
from kerple.data.indexed_dataset import MMapIndexedDataset, index_path
from kerple.data.indexed_dataset import data_path as bin_path

SPLIT_NAMES = ("train", "valid", "test")


def split_weights(split: str) -> list[float]:
    """The train, valid and test weights of a split string: one to three non-negative numbers with a
    positive sum, separated by "," (or "/"); the missing ones are 0 (the reference's rule)."""
    separator = "," if "," in split else "/"
    try:
        weights = [float(part) for part in split.split(separator) if part.strip() != ""]
    except ValueError as error:
        raise DataError(f"split {split!r}: expected weights like '949,50,1'") from error
    if not weights or any(not w >= 0 for w in weights) or not 0 < sum(weights) < float("inf") or len(weights) > 3:
        raise DataError(f"split {split!r}: expected 1 to 3 non-negative weights with a positive sum")
    return (weights + [0.0, 0.0])[:3]


def split_boundaries(split: str, num_documents: int) -> list[int]:
    """Item index boundaries ``[0, a, b, n]`` of the train/valid/test ranges for a split string
    (:func:`split_weights`): each range gets ``round(weight / total * n)`` items, the rounding error
    taken from the start so the last boundary is ``n`` (the reference's rule).
    """
    weights = split_weights(split)
    total = sum(weights)
    bounds = [0]
    for weight in weights:
        bounds.append(bounds[-1] + int(round(weight / total * float(num_documents))))
    excess = bounds[-1] - num_documents
    return [bounds[0]] + [bound - excess for bound in bounds[1:]]


def num_epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Smallest epoch count whose tokens give ``num_samples`` windows of ``seq_length + 1``."""
    if tokens_per_epoch <= 0:
        raise DataError("the selected documents contain no tokens")
    # (epochs * tokens_per_epoch - 1) // seq_length >= num_samples  <=>  epochs * tokens_per_epoch >= num_samples * seq_length + 1
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


INDEX_MAP_MAX_BYTES = 8 * 2**30
"""Memory the index maps of one split may take while they are built (8 GiB: 162M's 50,000 steps
of 32 samples need 40 MB). A larger need is an absurd ``train_iters`` or batch, refused by name."""


def index_map_bytes(num_documents: int, epochs: int, num_samples: int) -> int:
    """Peak bytes of :func:`build_doc_idx`, :func:`build_sample_idx` and :func:`build_shuffle_idx`:
    about 20 bytes per tiled document and 28 per sample (their int32/int64 arrays and temporaries)."""
    return 20 * num_documents * epochs + 28 * (num_samples + 1)


def build_sample_idx(
    sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, tokens_in_epochs: int
) -> np.ndarray:
    """Start ``(doc_idx position, offset)`` of every sample, plus the end of the last: ``[n+1, 2]``.

    Sample ``i`` covers tokens ``i*seq_length ... (i+1)*seq_length`` of the concatenation of the
    documents in ``doc_idx`` order; a start is placed in the document that holds that token
    (empty documents are never a start, except position 0 for the first sample).
    """
    num_samples = (tokens_in_epochs - 1) // seq_length
    doc_lengths = sizes[doc_idx].astype(np.int64)
    doc_starts = np.zeros(len(doc_lengths) + 1, dtype=np.int64)
    np.cumsum(doc_lengths, out=doc_starts[1:])
    positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    which = np.searchsorted(doc_starts, positions, side="right") - 1
    which = np.minimum(which, len(doc_lengths) - 1)
    sample_idx = np.empty((num_samples + 1, 2), dtype=np.int32)
    sample_idx[:, 0] = which
    sample_idx[:, 1] = positions - doc_starts[which]
    sample_idx[0] = (0, 0)
    return sample_idx


def build_doc_idx(documents: np.ndarray, num_epochs: int, rng: np.random.RandomState) -> np.ndarray:
    """The document ids repeated ``num_epochs`` times, shuffled together (int32)."""
    doc_idx = np.tile(np.asarray(documents, dtype=np.int32), num_epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def build_shuffle_idx(size: int, rng: np.random.RandomState) -> np.ndarray:
    """A permutation of ``range(size)``: uint32, int64 when that cannot hold the values."""
    dtype = np.uint32 if size < np.iinfo(np.uint32).max - 1 else np.int64
    shuffle_idx = np.arange(size, dtype=dtype)
    rng.shuffle(shuffle_idx)
    return shuffle_idx


def _save_atomic(path: Path, array: np.ndarray) -> None:
    """``np.save`` to a temporary name in the same folder, then rename (:mod:`kerple.atomic`)."""
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        np.save(handle, array, allow_pickle=False)


def index_map_prefix(data_prefix: str | Path, name: str, num_samples: int, seq_length: int, seed: int) -> str:
    """The reference's cache name: ``<prefix>_<name>_indexmap_<n>ns_<sl>sl_<seed>s``."""
    return f"{data_prefix}_{name}_indexmap_{num_samples}ns_{seq_length}sl_{seed}s"


def build_index_mappings(
    name: str,
    data_prefix: str | Path,
    documents: np.ndarray,
    sizes: np.ndarray,
    num_samples: int,
    seq_length: int,
    seed: int,
    cache: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(doc_idx, sample_idx, shuffle_idx)``, loaded from the ``.npy`` cache when present."""
    base = index_map_prefix(data_prefix, name, num_samples, seq_length, seed)
    files = [Path(f"{base}_{kind}.npy") for kind in ("doc_idx", "sample_idx", "shuffle_idx")]
    if cache and all(file.is_file() for file in files):
        try:
            return tuple(np.load(file, mmap_mode="r", allow_pickle=False) for file in files)  # type: ignore[return-value]
        except (ValueError, OSError) as error:
            raise DataError(f"{base}_*.npy: unreadable index-map cache ({error}); delete it") from error
    tokens_per_epoch = int(sizes[documents].astype(np.int64).sum())
    epochs = num_epochs_needed(tokens_per_epoch, seq_length, num_samples)
    needed = index_map_bytes(len(documents), epochs, num_samples)
    if needed > INDEX_MAP_MAX_BYTES:
        raise DataError(
            f"{data_prefix}: the {name} split's sample index for {num_samples:,} samples of {seq_length} tokens "
            f"({epochs:,} epochs of its {tokens_per_epoch:,} tokens) would take {needed / 2**30:,.0f} GiB, above the "
            f"{INDEX_MAP_MAX_BYTES // 2**30} GiB allowed; lower train_iters (samples = train_iters x global batch"
            f"{'' if name == 'train' else ', and eval_iters for validation'}) or use more data"
        )
    rng = np.random.RandomState(seed=seed)
    doc_idx = build_doc_idx(documents, epochs, rng)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, epochs * tokens_per_epoch)
    shuffle_idx = build_shuffle_idx(sample_idx.shape[0] - 1, rng)
    if cache:
        for file, array in zip(files, (doc_idx, sample_idx, shuffle_idx)):
            _save_atomic(file, array)
    return doc_idx, sample_idx, shuffle_idx


def check_enough_tokens(name: str, data_prefix: str | Path, tokens: int, seq_length: int) -> None:
    """Refuse a split holding fewer tokens than one sample of ``seq_length + 1``: tiling it for
    enough epochs would train (or evaluate) on the same few tokens wrapped around, over and over."""
    if tokens < seq_length + 1:
        key = "seq-length" if name == "train" else "seq-length-val (seq-length when unset)"
        raise DataError(f"{data_prefix}: the {name} split holds {tokens:,} tokens, fewer than one sample of "
                        f"{key} + 1 = {seq_length + 1}; add documents, lower {key}, or give {name} a larger "
                        "share of split")


class GPT2Dataset:
    """Samples of ``seq_length + 1`` tokens drawn from a document range of an indexed dataset.

    ``dataset[i]`` returns ``{"text": int64[seq_length + 1]}`` like the reference, plus
    ``"tokens"`` (text[:-1]) and ``"labels"`` (text[1:]). ``len`` is the number of samples the
    tiled epochs provide (at least ``num_samples``).
    """

    def __init__(
        self,
        name: str,
        data_prefix: str | Path,
        documents: np.ndarray,
        indexed_dataset: MMapIndexedDataset,
        num_samples: int,
        seq_length: int,
        seed: int,
        cache: bool = True,
    ) -> None:
        if len(documents) == 0:
            raise DataError(f"{data_prefix}: the {name} range has no documents")
        if int(np.min(documents)) < 0 or int(np.max(documents)) >= len(indexed_dataset):
            raise DataError(f"{data_prefix}: {name} document ids outside 0..{len(indexed_dataset) - 1}")
        check_enough_tokens(name, data_prefix, int(indexed_dataset.sizes[documents].astype(np.int64).sum()),
                            seq_length)
        self.name = name
        self.seq_length = seq_length
        self.indexed_dataset = indexed_dataset
        self.doc_idx, self.sample_idx, self.shuffle_idx = build_index_mappings(
            name, data_prefix, documents, indexed_dataset.sizes, num_samples, seq_length, seed, cache
        )

    def __len__(self) -> int:
        return self.sample_idx.shape[0] - 1

    def sample(self, index: int) -> np.ndarray:
        """The ``seq_length + 1`` tokens of sample ``index`` (after shuffling), as int64."""
        shuffled = int(self.shuffle_idx[index])
        first_doc, first_offset = (int(v) for v in self.sample_idx[shuffled])
        last_doc, last_offset = (int(v) for v in self.sample_idx[shuffled + 1])
        data = self.indexed_dataset
        if first_doc == last_doc:
            pieces = [data.get(int(self.doc_idx[first_doc]), first_offset, last_offset - first_offset + 1)]
        else:
            pieces = [data.get(int(self.doc_idx[first_doc]), first_offset)]
            pieces += [data.get(int(self.doc_idx[i])) for i in range(first_doc + 1, last_doc)]
            pieces.append(data.get(int(self.doc_idx[last_doc]), 0, last_offset + 1))
        return np.concatenate(pieces).astype(np.int64)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        text = self.sample(index)
        return {"text": text, "tokens": text[:-1], "labels": text[1:]}


@dataclass
class SplitDatasets:
    """The train, valid and test datasets; a range without documents or samples is None."""

    train: GPT2Dataset | BlendedDataset | None
    valid: GPT2Dataset | BlendedDataset | None
    test: GPT2Dataset | BlendedDataset | None


def build_train_valid_test_datasets(
    data_prefix: str | Path,
    split: str,
    num_samples: tuple[int, int, int],
    seq_length: int,
    seed: int,
    seq_length_eval: int | None = None,
    cache: bool = True,
) -> SplitDatasets:
    """Split one indexed dataset by ``split`` into the reference's three ``GPT2Dataset`` ranges.

    Valid and test samples are ``seq_length_eval`` long (``seq_length`` when None).
    """
    indexed = MMapIndexedDataset(data_prefix)
    bounds = split_boundaries(split, len(indexed))
    built: list[GPT2Dataset | None] = []
    for position, name in enumerate(SPLIT_NAMES):
        documents = np.arange(bounds[position], bounds[position + 1], dtype=np.int32)
        length = seq_length if name == "train" else (seq_length_eval or seq_length)
        if len(documents) == 0 or num_samples[position] <= 0:
            built.append(None)
            continue
        built.append(
            GPT2Dataset(name, data_prefix, documents, indexed, num_samples[position], length, seed, cache)
        )
    return SplitDatasets(*built)


def build_single_dataset(
    name: str, data_prefix: str | Path, num_samples: int, seq_length: int, seed: int, cache: bool = True
) -> GPT2Dataset:
    """All documents of one indexed dataset as one range (for separate train/valid/test paths)."""
    indexed = MMapIndexedDataset(data_prefix)
    documents = np.arange(len(indexed), dtype=np.int32)
    return GPT2Dataset(name, data_prefix, documents, indexed, num_samples, seq_length, seed, cache)


def neox_num_samples(
    train_iters: int, train_batch_size: int, eval_interval: int, eval_iters: int
) -> tuple[int, int, int]:
    """The reference's sample counts: train iters, and eval iters at every interval plus one."""
    evaluations = (train_iters // eval_interval + 1) * eval_iters if eval_interval > 0 else eval_iters
    return (
        train_iters * train_batch_size,
        evaluations * train_batch_size,
        eval_iters * train_batch_size,
    )


def require_dataset_files(cfg: Any, key: str, prefix: str | Path) -> None:
    """Refuse a dataset prefix from config key ``data.<key>`` whose ``.idx`` or ``.bin`` is missing, naming
    the key, the file that set it and the likely slip (a file name for the prefix, a prefix missing
    ``_text_document``); the reader alone can name only the missing file."""
    prefix = str(prefix)
    missing = [str(path) for path in (index_path(prefix), bin_path(prefix)) if not path.is_file()]
    if not missing:
        return
    if prefix.endswith((".bin", ".idx")):
        fix = f"give the prefix without the extension ({prefix[:-4]})"
    elif index_path(f"{prefix}_text_document").is_file():
        fix = f"did you mean {prefix}_text_document?"
    else:
        fix = "fix the path in the config, or prepare the data (prepare_data.py)"
    raise DataError(f"{key} {prefix} ({cfg.provenance(f'data.{key}')[0]}): {' and '.join(missing)} not found; {fix}")


def _paths(value: Any) -> list[str]:
    """A path field that may be null, a string or a list."""
    if value is None or value == "" or value == []:
        return []
    return [str(item) for item in value] if isinstance(value, (list, tuple)) else [str(value)]


def build_separate_datasets(cfg: Any, num_samples: tuple[int, int, int], seq_length: int, seq_length_eval: int,
                            seed: int, cache: bool = True) -> SplitDatasets:
    """``train_data_paths``/``valid_data_paths``/``test_data_paths`` as GPT-NeoX builds them: each
    list blended by its weights (:mod:`kerple.data.blending`; one path is a blend of one), dataset
    ``i`` of a list named ``<split>_<i>``."""
    built: list[BlendedDataset | None] = []
    for position, name in enumerate(SPLIT_NAMES):
        paths = _paths(getattr(cfg.data, f"{name}_data_paths", None))
        if not paths or num_samples[position] <= 0:
            built.append(None)
            continue
        weights = getattr(cfg.data, f"{name}_data_weights", None) or [1.0] * len(paths)
        if len(weights) != len(paths):
            raise DataError(f"{name}_data_weights has {len(weights)} weights for {len(paths)} {name}_data_paths; "
                            "give one weight per path (or none: equal weights)")
        normalized, counts = blend_num_samples(weights, num_samples[position])
        length = seq_length if name == "train" else seq_length_eval
        datasets = []
        for index, (prefix, count) in enumerate(zip(paths, counts)):
            require_dataset_files(cfg, f"{name}_data_paths", prefix)
            datasets.append(build_single_dataset(f"{name}_{index}", prefix, count, length, seed, cache))
        built.append(BlendedDataset(datasets, normalized))
    return SplitDatasets(*built)


def build_datasets_from_config(cfg: Any, num_samples: tuple[int, int, int], cache: bool = True) -> SplitDatasets:
    """Datasets for a loaded config: ``cfg.data.data_path`` split by ``cfg.data.split``, or
    separate ``train_data_paths``/``valid_data_paths``/``test_data_paths`` when those are set.

    Uses ``cfg.model.seq_length``, ``cfg.data.seq_length_val`` (valid/test length, defaults to
    seq_length) and ``cfg.training.seed``.
    """
    data = cfg.data
    seq_length = int(cfg.model.seq_length)
    seq_length_eval = getattr(data, "seq_length_val", None) or seq_length
    seed = int(cfg.training.seed)
    if any(_paths(getattr(data, f"{name}_data_paths", None)) for name in SPLIT_NAMES):
        return build_separate_datasets(cfg, num_samples, seq_length, seq_length_eval, seed, cache)
    prefix = getattr(data, "data_path", None)
    if not prefix:
        raise DataError("no config sets data_path (or train_data_paths): add a data config such as "
                        "configs/data/stdlib_bpe.yml (its data from prepare_data.py), or data_path=PREFIX")
    require_dataset_files(cfg, "data_path", str(prefix))
    return build_train_valid_test_datasets(
        prefix, str(getattr(data, "split", None) or "969,30,1"), num_samples, seq_length, seed, seq_length_eval, cache
    )
