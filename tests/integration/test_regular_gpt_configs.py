"""configs/models/regulargpt-*.yml: the Table 6.3/6.4 settings load with Table 6.6's sizes, and the
tiny one trains with train.py and evaluates with evaluate.py (last-token protocol of thesis §6.5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "training"))

from kerple.config import load_config  # noqa: E402
from kerple.model import build_model  # noqa: E402
from tiny_run import REPO, tiny_overrides, write_corpus  # noqa: E402

# (C, K) of Tables 6.3 and 6.4
SETTINGS = [(32, 6), (64, 6), (128, 6), (128, 12), (256, 6)]


@pytest.mark.parametrize(("chunk", "thickness"), SETTINGS)
def test_table_settings_load_with_table_6_6_sizes(chunk: int, thickness: int) -> None:
    cfg = load_config([REPO / f"configs/models/regulargpt-c{chunk}-k{thickness}.yml"])
    model = cfg.model
    assert (model.arch, model.regular_chunk_size, model.regular_thickness) == ("regulargpt", chunk, thickness)
    assert (model.hidden_size, model.num_attention_heads, model.seq_length) == (768, 12, 512)
    # Table 6.6: 81M (K = 6) or 123M (K = 12) parameters. Tied embeddings V·h plus K blocks of
    # 12h² + 13h + H·C, plus the final LayerNorm 2h (V = 50304, the padded GPT-2 vocabulary) and the
    # PAD embedding h of the visible padding (§6.2.1).
    h, vocab = 768, 50304
    expected = vocab * h + thickness * (12 * h * h + 13 * h + 12 * chunk) + 2 * h + h
    assert round(expected / 1e6) == {6: 81, 12: 124}[thickness]  # the thesis rounds 123.7M down to 123M
    built = build_model(cfg, flex_compile=False)
    assert sum(p.numel() for p in built.parameters()) == expected


def test_tiny_config_trains_and_evaluates(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", documents=300)
    checkpoints = tmp_path / "ckpt"
    overrides = tiny_overrides(corpus, train_iters=6, lr_decay_iters=6, save=str(checkpoints), save_interval=6, num_workers=0)
    for key in ("pos_emb", "num_layers"):
        overrides.pop(key)
    arguments = ["configs/models/regulargpt-tiny.yml", *(f"{k}={'' if v is None else v}" for k, v in overrides.items())]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "train.py", *arguments], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    output = tmp_path / "eval.json"
    done = subprocess.run(
        [sys.executable, "evaluate.py", *arguments, "--load", str(checkpoints), "--eval-lengths", "32,64,128",
         "--protocol", "last_token", "--num-windows", "8", "--output", str(output), "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(output.read_text())["results"]
    assert [r["input_length"] for r in rows] == [31, 63, 127]
    assert all(0.0 < r["loss"] < 10.0 for r in rows)
    # A softmax temperature (thesis §5.4) is for biased attention; RegularGPT refuses it in one line, writing nothing.
    refused = tmp_path / "tau.json"
    done = subprocess.run(
        [sys.executable, "evaluate.py", *arguments, "--load", str(checkpoints), "--eval-lengths", "64",
         "--softmax-temperature", "0.7", "--output", str(refused), "--no-progress"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "model.arch regulargpt takes no softmax temperature" in done.stderr and "Traceback" not in done.stderr
    assert not refused.exists()
