"""Pickles with planted callables are refused without running them; plain data types load."""

from __future__ import annotations

import argparse
import collections
import os
import pathlib

import numpy as np
import pytest
import torch

from ckpt_helpers import reference_tensors, write_reference_checkpoint
from kerple.checkpoint import UnsafeCheckpointError, read_checkpoint, safe_torch_load


class PlantedCallable:
    """Unpickling this calls ``os.system`` (creating ``marker``) - what a malicious checkpoint does."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_planted_callable_is_refused_without_running(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pt"
    torch.save({"weight": torch.ones(2), "payload": PlantedCallable(marker)}, path)
    with pytest.raises(UnsafeCheckpointError) as caught:
        safe_torch_load(path)
    assert not marker.exists()
    message = str(caught.value)
    assert "system" in message and "--trust-checkpoint" in message
    assert any(name.endswith(".system") for name in caught.value.offending)


def test_trust_opt_in_runs_the_pickle(tmp_path):
    """The opt-in really is the unsafe path (proves the refusal above is what protected us)."""
    marker = tmp_path / "RAN"
    path = tmp_path / "evil.pt"
    torch.save({"payload": PlantedCallable(marker)}, path)
    safe_torch_load(path, trust=True)
    assert marker.exists()


def test_planted_callable_in_a_layer_file_stops_the_reader(tmp_path):
    root = write_reference_checkpoint(tmp_path / "ckpt", reference_tensors("kerple_log"), pos_emb="kerple_log")
    marker = tmp_path / "PWNED"
    layer = root / "global_step50" / "layer_02-model_00-model_states.pt"
    tensors = torch.load(layer, weights_only=True)
    tensors["attention.rpe.extra"] = PlantedCallable(marker)
    torch.save(tensors, layer)
    with pytest.raises(UnsafeCheckpointError, match="layer_02-model_00"):
        read_checkpoint(root)
    assert not marker.exists()


def test_plain_data_types_of_neox_files_load(tmp_path):
    path = tmp_path / "meta.pt"
    record = {
        "args": argparse.Namespace(num_layers=2, save=pathlib.Path("/ckpt")),
        "np_rng_state": np.random.RandomState(0).get_state(),
        "lr": np.float64(0.5),
        "module": collections.OrderedDict(w=torch.zeros(3)),
        "random_rng_state": (3, tuple(range(5)), None),
    }
    torch.save(record, path)
    loaded = safe_torch_load(path)
    assert loaded["args"].num_layers == 2 and loaded["args"].save == pathlib.Path("/ckpt")
    assert np.array_equal(loaded["np_rng_state"][1], record["np_rng_state"][1])
    assert float(loaded["lr"]) == 0.5


def test_missing_file_is_named(tmp_path):
    with pytest.raises(Exception, match="nope.pt"):
        safe_torch_load(tmp_path / "nope.pt")
