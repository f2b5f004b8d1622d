"""A prepared dataset read back from the ``info.json`` prepare_data.py wrote, and the config keys that
point a run at it."""

from __future__ import annotations

import json
from pathlib import Path

from kerple.config import load_config, parse_overrides
from kerple.data import MMapIndexedDataset, preprocess
from kerple.data.prepared import PreparedData

REPO = Path(__file__).resolve().parents[3]


def test_a_prepared_dataset_reads_back_and_configures_a_run(tmp_path: Path) -> None:
    root = tmp_path / "code"
    for i in range(12):
        (root / f"m{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (root / f"m{i}.py").write_text(f"def function_{i}(argument):\n    return argument * {i} + {i * i}\n")
    preprocess.run(["python", "--root", str(root), "-d", str(tmp_path / "data"), "--train-tokenizer", "300",
                    "--split", "75,25,0", "--quiet"])
    info_file = tmp_path / "data" / "python" / "python_text_document.info.json"
    data = PreparedData.from_info(info_file)
    tokenizer = json.loads(Path(json.loads(info_file.read_text())["tokenizer"]["vocab_file"]).read_text())
    ids = set(tokenizer["model"]["vocab"].values()) | {token["id"] for token in tokenizer["added_tokens"]}
    assert data.vocab_size == len(ids) == 300
    dataset = MMapIndexedDataset(data.prefix)
    assert data.documents("train") + data.documents("valid") == len(dataset) == 12 and data.documents("test") == 0
    assert data.tokens("train") + data.tokens("valid") == int(sum(len(dataset[i]) for i in range(len(dataset))))
    assert data.source["files_kept"] == 12
    cfg = load_config([REPO / "configs" / "models" / "tiny.yml"], parse_overrides(
        [f"{key}={value}" for key, value in data.config_overrides().items()]))
    assert (cfg.data.data_path, cfg.data.split, cfg.data.tokenizer_type) == (data.prefix, data.split, "HFTokenizer")
    assert cfg.data.vocab_file == data.tokenizer_file and cfg.model.vocab_size == 300
    moved = PreparedData.from_info(info_file, prefix="elsewhere/python_text_document")
    assert moved.prefix == "elsewhere/python_text_document" and moved.split == data.split
