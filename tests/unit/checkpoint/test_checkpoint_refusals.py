"""A damaged checkpoint is refused by name: a ``latest`` that is not text or names a path, a layer
file that is corrupt, truncated or missing, a missing model-parallel record."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from kerple.checkpoint import CheckpointError, find_checkpoint, read_checkpoint, safe_torch_load
from kerple.checkpoint.files import latest_tag
from kerple.evaluation import cli as evaluate_cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
LAYER = "layer_{:02d}-model_{:02d}-model_states.pt"


def copy_fixture(tmp_path: Path, name: str) -> Path:
    """A writable copy of a fixture's save folder."""
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def test_latest_that_is_not_text_is_named(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "trainer-kerple_log")
    (root / "latest").write_bytes(b"\xff\xfe\x00global_step3")
    with pytest.raises(CheckpointError) as raised:
        find_checkpoint(root)
    message = str(raised.value)
    assert message.startswith(f"{root / 'latest'}: not a text file naming a checkpoint folder")
    assert f"iterations in {root}: 3" in message


@pytest.mark.parametrize("tag", ["../outside/global_step3", "{outside}/global_step3", "global_step3/../global_step3",
                                 "..", ".", ""])
def test_latest_naming_a_path_is_refused(tmp_path: Path, tag: str) -> None:
    root = copy_fixture(tmp_path, "trainer-kerple_log")
    outside = tmp_path / "outside"
    shutil.copytree(root / "global_step3", outside / "global_step3")  # a loadable checkpoint elsewhere
    (root / "latest").write_text(tag.format(outside=outside))
    with pytest.raises(CheckpointError, match="not a checkpoint folder name: it must be one folder inside"):
        latest_tag(root)
    with pytest.raises(CheckpointError):
        read_checkpoint(root)
    assert read_checkpoint(root, iteration=3).iteration == 3  # naming the iteration still works


def test_latest_naming_a_folder_name_is_read(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "trainer-kerple_log")
    (root / "latest").write_text("global_step3\n")
    assert latest_tag(root) == "global_step3" and find_checkpoint(root) == root / "global_step3"
    assert latest_tag(tmp_path) is None


def test_evaluate_reports_a_bad_latest_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = copy_fixture(tmp_path, "convert-rpe-pipeline-mp2-neox")
    (root / "latest").write_bytes(bytes(range(200, 256)))
    status = evaluate_cli.main(["--load", str(root), "--eval-lengths", "16", "--num-tokens", "64",
                                "--output", str(tmp_path / "e.json")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    assert f"evaluate.py: error: {root / 'latest'}: not a text file naming a checkpoint folder" in err
    assert not (tmp_path / "e.json").exists()


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "random":
        path.write_bytes(np.random.RandomState(0).randint(0, 256, len(data), dtype=np.uint8).tobytes())
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["random", "truncated", "empty"])
@pytest.mark.parametrize("trust", [False, True])
def test_corrupt_layer_file_is_named(tmp_path: Path, how: str, trust: bool) -> None:
    root = copy_fixture(tmp_path, "trainer-kerple_log")
    layer = root / "global_step3" / LAYER.format(2, 0)
    _damage(layer, how)
    with pytest.raises(CheckpointError) as raised:
        read_checkpoint(root, trust=trust)
    message = str(raised.value)
    assert message.startswith(f"{layer}: corrupt or truncated checkpoint file (")
    assert "file an issue" not in message and "weights_only" not in message and len(message) < 400
    with pytest.raises(CheckpointError, match="corrupt or truncated checkpoint file"):
        safe_torch_load(layer, trust=trust)


@pytest.mark.parametrize("index", [0, 2, 3, 5, 6])  # embedding, both layers, final norm, untied head
def test_missing_layer_file_is_named(tmp_path: Path, index: int) -> None:
    root = copy_fixture(tmp_path, "trainer-kerple_log")
    (root / "global_step3" / LAYER.format(index, 0)).unlink()
    with pytest.raises(CheckpointError) as raised:
        read_checkpoint(root)
    assert str(raised.value).startswith(f"{root / 'global_step3'} is incomplete: {LAYER.format(index, 0)} missing")


@pytest.mark.parametrize("index", [0, 2, 3, 5])  # RegularGPT K = 2: pad+token embedding, two shared blocks, norm
def test_a_regular_gpt_checkpoint_counts_its_shared_blocks(tmp_path: Path, index: int) -> None:
    root = copy_fixture(tmp_path, "regular-c3-k2")
    read_checkpoint(root)  # complete: K = 2 block files, not num_layers of them
    (root / "global_step5" / LAYER.format(index, 0)).unlink()
    with pytest.raises(CheckpointError, match=rf"is incomplete: {LAYER.format(index, 0)} missing"):
        read_checkpoint(root)


@pytest.mark.parametrize("index,missing", [
    (3, "layer_03-model_00-model_states.pt, layer_03-model_01-model_states.pt missing"),
    # without num_layers, file 6 is the final norm of 3 layers or the head of 2: both readings are named
    (5, "layer_04-model_00-model_states.pt, layer_04-model_01-model_states.pt or "
        "layer_05-model_00-model_states.pt, layer_05-model_01-model_states.pt missing"),
])
def test_missing_layer_file_is_named_without_a_layer_count(tmp_path: Path, index: int, missing: str) -> None:
    root = copy_fixture(tmp_path, "convert-rpe-pipeline-mp2-neox")
    folder = root / "global_step7"
    (folder / "configs" / "model.yml").unlink()  # neither args nor configs/ give num_layers now
    (folder / "mp_rank_00_model_states.pt").unlink()
    (folder / "mp_rank_01_model_states.pt").unlink()
    for rank in (0, 1):
        (folder / LAYER.format(index, rank)).unlink()
    with pytest.raises(CheckpointError, match=f"is incomplete: {missing}"):
        read_checkpoint(root)


def test_layer_file_missing_on_one_model_parallel_rank_is_named(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "convert-rpe-pipeline-mp2-neox")
    (root / "global_step7" / LAYER.format(3, 1)).unlink()
    with pytest.raises(CheckpointError, match=rf"is incomplete: {LAYER.format(3, 1)} missing \(other model-parallel"):
        read_checkpoint(root)


def test_missing_first_model_parallel_record_is_named(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "convert-kerple_log-sequential-mp2-neox")
    (root / "global_step7" / "mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointError, match=r"is incomplete: mp_rank_00_model_states\.pt missing"):
        read_checkpoint(root)
