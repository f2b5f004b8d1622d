"""Data: tokenizers, Megatron mmap indexed datasets, GPT-NeoX sampling and corpus sources.

Public names (see each module's docstring):
``build_tokenizer``, ``Tokenizer`` (``kerple.data.tokenizers``);
``IndexedDatasetWriter``, ``MMapIndexedDataset`` (``kerple.data.indexed_dataset``);
``GPT2Dataset``, ``build_train_valid_test_datasets``, ``build_datasets_from_config``,
``neox_num_samples`` (``kerple.data.gpt2_dataset``); ``BlendedDataset`` (``kerple.data.blending``);
``SOURCES``, ``get_source`` (``kerple.data.sources``); ``tokenize_corpus``, ``main`` (``kerple.data.preprocess``);
``DataError`` for every data problem.
"""

from kerple.data.blending import BlendedDataset
from kerple.data.errors import DataError
from kerple.data.gpt2_dataset import (
    GPT2Dataset,
    SplitDatasets,
    build_datasets_from_config,
    build_train_valid_test_datasets,
    neox_num_samples,
    split_boundaries,
)
from kerple.data.indexed_dataset import IndexedDatasetWriter, MMapIndexedDataset, best_fitting_dtype
from kerple.data.tokenizers import Tokenizer, build_tokenizer

__all__ = [
    "BlendedDataset",
    "DataError",
    "GPT2Dataset",
    "IndexedDatasetWriter",
    "MMapIndexedDataset",
    "SplitDatasets",
    "Tokenizer",
    "best_fitting_dtype",
    "build_datasets_from_config",
    "build_tokenizer",
    "build_train_valid_test_datasets",
    "neox_num_samples",
    "split_boundaries",
]
