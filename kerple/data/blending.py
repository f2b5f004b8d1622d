"""GPT-NeoX's dataset blending: ``train_data_paths`` with ``train_data_weights`` (and the valid and
test lists), restated from its rule (docs/reference-format.md §7):

1. the weights are normalized, and dataset ``i`` gets ``ceil(num_samples * weight_i * 1.005)``
   samples (the 0.5% margin keeps every dataset from running short under the greedy order below);
   one path with no weight is the same rule with weight 1;
2. each dataset is a ``GPT2Dataset`` named ``<split>_<i>`` (its index-map cache names say so);
3. blended sample ``n`` comes from the dataset whose share lags most behind its weight:
   ``argmax_i(weight_i * max(n, 1) - taken_i)``, the first on a tie, then that dataset's next sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kerple.data.errors import DataError

SAMPLE_MARGIN = 1.005
"""GPT-NeoX's extra share of samples built for each blended dataset."""


def blend_num_samples(weights: Sequence[float], num_samples: int) -> tuple[list[float], list[int]]:
    """The normalized weights and each dataset's sample count (GPT-NeoX's
    ``get_normalized_weights_and_num_samples``: the same float operations, in the same order)."""
    total = sum(weights)
    if not total > 0 or any(not weight >= 0 for weight in weights):
        raise DataError(f"data weights {list(weights)}: expected non-negative numbers with a positive sum")
    normalized = [weight / total for weight in weights]
    return normalized, [int(math.ceil(num_samples * weight * SAMPLE_MARGIN)) for weight in normalized]


def blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dataset_index uint8[size], dataset_sample_index int64[size])`` of the greedy rule above.

    The weights are normalized once more in float64, as GPT-NeoX's ``BlendableDataset`` does, so the
    comparisons see the same values.
    """
    normalized = np.asarray(weights, dtype=np.float64)
    normalized = normalized / np.sum(normalized)
    if len(normalized) > 255:
        raise DataError(f"{len(normalized)} datasets to blend: at most 255 (GPT-NeoX's limit)")
    dataset_index = np.zeros(size, dtype=np.uint8)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    if len(normalized) == 1:  # the rule always picks the one dataset
        dataset_sample_index[:] = np.arange(size)
        return dataset_index, dataset_sample_index
    shares = [float(weight) for weight in normalized]
    taken = [0] * len(shares)
    for sample in range(size):
        scale = max(float(sample), 1.0)
        best, best_error = 0, shares[0] * scale - taken[0]
        for candidate in range(1, len(shares)):
            error = shares[candidate] * scale - taken[candidate]
            if error > best_error:
                best, best_error = candidate, error
        dataset_index[sample] = best
        dataset_sample_index[sample] = taken[best]
        taken[best] += 1
    return dataset_index, dataset_sample_index


class BlendedDataset:
    """Several datasets read in the blended order; ``len`` is the sum of theirs (GPT-NeoX's
    ``BlendableDataset``)."""

    def __init__(self, datasets: Sequence[Any], weights: Sequence[float]) -> None:
        if len(datasets) != len(weights):
            raise DataError(f"{len(datasets)} datasets but {len(weights)} weights")
        self.datasets = list(datasets)
        self.size = sum(len(dataset) for dataset in self.datasets)
        self.dataset_index, self.dataset_sample_index = blending_indices(weights, self.size)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.datasets[int(self.dataset_index[index])][int(self.dataset_sample_index[index])]
