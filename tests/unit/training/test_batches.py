"""A run without training data says which setting left it empty and how to fix it."""

from __future__ import annotations

from kerple.config import load_config
from kerple.training.batches import _no_training_data


def test_an_empty_training_part_names_the_split_and_where_it_was_set() -> None:
    cfg = load_config([], {"data_path": "data/x/x_text_document", "split": "0,100,0"})
    assert _no_training_data(cfg) == ("split '0,100,0' (<command line>) gives the training part of "
                                      "data/x/x_text_document no documents; give its first weight a share (e.g. '969,30,1')")


def test_valid_paths_without_train_paths_name_the_missing_key() -> None:
    cfg = load_config([], {"valid_data_paths": ["data/x/x_valid_text_document"]})
    assert _no_training_data(cfg).startswith("valid_data_paths/test_data_paths are set but train_data_paths is not")
