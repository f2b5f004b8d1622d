"""A run evaluated with ``rope_scaling`` is its own column, named after the method, next to its embedding."""

from __future__ import annotations

import json
import math
from pathlib import Path

from kerple.evaluation.compare import compare
from kerple.evaluation.stats import display_name, load_run


def write_result(folder: Path, name: str, pos_emb: str, rope_scaling: dict | None) -> Path:
    doc = {
        "run": {"pos_emb": pos_emb, "rope_scaling": rope_scaling, "dataset": "stdlib", "seed": 1, "train_seq_length": 64},
        "protocol": {"name": "nonoverlap", "attention_window": None},
        "results": [{"length": length, "loss": math.log(100.0 + length / 64), "ppl": 100.0 + length / 64}
                    for length in (64, 128)],
    }
    path = folder / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_scaled_runs_are_columns_after_their_embedding(tmp_path: Path) -> None:
    paths = [
        write_result(tmp_path, "yarn", "rotary", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}),
        write_result(tmp_path, "kerple_log", "kerple_log", None),
        write_result(tmp_path, "pi", "rotary", {"rope_type": "linear", "factor": 2.0}),
        write_result(tmp_path, "rotary", "rotary", None),
        write_result(tmp_path, "alibi", "alibi", None),
    ]
    assert load_run(paths[0]).variant == "rotary+yarn" and load_run(paths[3]).variant == "rotary"
    assert display_name("rotary+dynamic") == "Rotary + dynamic NTK"
    text, _ = compare(paths, reference="kerple_log")
    assert "| Extrp. | KERPLE (log) | ALiBi | Rotary | Rotary + PI | Rotary + YaRN |" in text
