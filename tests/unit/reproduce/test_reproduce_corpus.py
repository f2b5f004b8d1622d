"""The lease's corpus: held out by file, capped in tokens and in time, written as prepare_data.py writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kerple.data.indexed_dataset import MMapIndexedDataset
from kerple.data.prepared import PreparedData
from kerple.errors import KerpleError
from kerple.reproduce.corpus import build, main, parse_args, split_of, split_shares


def sources(root: Path, count: int) -> Path:
    root.mkdir()
    for i in range(count):
        body = "".join(f"    value_{j} = compute({i}, {j}) + offset_{j % 7}\n" for j in range(60))
        (root / f"module_{i}.py").write_text(f"def function_{i}(argument):\n{body}    return argument\n")
    (root / "copy_of_0.py").write_text((root / "module_0.py").read_text())  # the same content twice: one document
    (root / "empty.py").write_text("")
    return root


def arguments(tmp_path: Path, root: Path, max_tokens: int, seconds: float = 60.0) -> list[str]:
    return ["--prefix", str(tmp_path / "data" / "python" / "python_text_document"), "--vocab", "300", "--split",
            "80,20,0", "--max-tokens", str(max_tokens), "--seconds", str(seconds), "--bpe-sample-chars", "100000",
            "--root", str(root)]


def test_files_are_held_out_by_a_hash_of_their_key() -> None:
    assert split_shares("949,50,1") == (0.05, 0.001) and split_shares("90,10") == (0.1, 0.0)
    splits = [split_of(f"root/module_{i}.py", 0.2, 0.0) for i in range(2000)]
    assert splits == [split_of(f"root/module_{i}.py", 0.2, 0.0) for i in range(2000)]  # the same every time
    assert 0.17 < splits.count("valid") / 2000 < 0.23 and "test" not in splits


def test_every_file_once_when_the_cap_is_not_reached(tmp_path: Path) -> None:
    root = sources(tmp_path / "src", 30)
    assert main(arguments(tmp_path, root, 10**9)) == 0
    info = json.loads((tmp_path / "data" / "python" / "python_text_document.info.json").read_text())
    corpus = PreparedData.from_info(tmp_path / "data" / "python" / "python_text_document.info.json")
    assert info["source"]["files_found"] == 31 and info["source"]["duplicates_removed"] == 1
    assert info["source"]["cap"]["stopped_by"] == "sources"
    assert corpus.documents("train") + corpus.documents("valid") == 30 and corpus.documents("valid") > 0
    assert info["split"] == f"{corpus.documents('train')},{corpus.documents('valid')},0" and corpus.vocab_size == 300
    dataset = MMapIndexedDataset(info["prefix"])
    assert len(dataset) == 30 and sum(len(dataset[i]) for i in range(30)) == info["tokens"]


def test_the_cap_and_the_deadline_stop_the_reading(tmp_path: Path) -> None:
    root = sources(tmp_path / "src", 30)
    assert main(arguments(tmp_path, root, 5000)) == 0
    info = json.loads((tmp_path / "data" / "python" / "python_text_document.info.json").read_text())
    assert info["source"]["cap"]["stopped_by"] == "cap" and 5000 <= info["tokens"] < 5000 + 2000
    with pytest.raises(KerpleError, match="spent before any document was tokenized: give more --minutes"):
        build(parse_args(arguments(tmp_path / "other", root, 5000, seconds=0.0)))
