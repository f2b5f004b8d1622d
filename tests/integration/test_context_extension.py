"""RoPE context extension end to end at tiny scale (docs/context-extension.md): a rotary model trained
without scaling is evaluated zero-shot with ``rope_scaling=...``, generates with it, and is fine-tuned
at twice its length with the scaling on (``finetune=true``); the fine-tuned run keeps the scaling."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "training"))

from tiny_run import REPO, tiny_overrides, write_corpus  # noqa: E402

YARN = '{"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}'
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def run(*arguments: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *arguments], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A 20-step rotary checkpoint at length 32 and the config arguments that describe it."""
    root = tmp_path_factory.mktemp("extension")
    corpus = write_corpus(root / "corpus", documents=400)
    overrides = tiny_overrides(corpus, pos_emb="rotary", max_position_embeddings=32, train_iters=20, lr_decay_iters=20,
                               save=str(root / "ckpt"), save_interval=20, num_workers=0)
    arguments = ["configs/models/tiny.yml", *(f"{key}={'' if value is None else value}" for key, value in overrides.items())]
    run("train.py", *arguments)
    return root, arguments


def evaluate(trained: tuple[Path, list[str]], name: str, *extra: str) -> dict:
    root, arguments = trained
    output = root / f"{name}.json"
    run("evaluate.py", *arguments, "--load", str(root / "ckpt"), "--eval-lengths", "32,128", "--no-progress",
        "--output", str(output), *extra)
    return json.loads(output.read_text())


def test_zero_shot_scaling_at_evaluation(trained: tuple[Path, list[str]]) -> None:
    plain = evaluate(trained, "plain")
    dynamic = evaluate(trained, "dynamic", 'rope_scaling={"rope_type": "dynamic", "factor": 1.0}')
    yarn = evaluate(trained, "yarn", f"rope_scaling={YARN}", "--attention-impl", "sdpa")
    ppl = {name: {row["length"]: row["ppl"] for row in doc["results"]} for name, doc in
           (("plain", plain), ("dynamic", dynamic), ("yarn", yarn))}
    assert ppl["dynamic"][32] == ppl["plain"][32] and ppl["dynamic"][128] != ppl["plain"][128]  # rescales beyond 32 only
    assert ppl["yarn"][32] != ppl["plain"][32]  # fixed frequencies and the temperature, at every length
    assert yarn["run"]["rope_scaling"] == json.loads(YARN) and plain["run"]["rope_scaling"] is None


def test_generation_with_scaling(trained: tuple[Path, list[str]]) -> None:
    """generate's KV cache with YaRN's fixed frequencies decodes the tokens a full forward per step decodes,
    and the scaling reached the loaded model."""
    import torch

    from kerple.inference.generate import generate
    from kerple.runs import load_run, run_config

    root, arguments = trained
    cfg = run_config([str(REPO / word) if word.endswith(".yml") else word for word in arguments] + [f"rope_scaling={YARN}"],
                     str(root / "ckpt"), quiet=True).cfg
    model = load_run(cfg, str(root / "ckpt"), quiet=True, flex_compile=False).model
    assert model.positional.frequencies(40)[1] == pytest.approx(0.1 * math.log(2.0) + 1.0)  # YaRN's sqrt(1/t)
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        cached = generate(model, prompt, 40)
        uncached = generate(model, prompt, 40, use_cache=False)
    assert torch.equal(cached, uncached) and cached.shape == (1, 45)


def test_finetuning_at_twice_the_length_keeps_the_scaling(trained: tuple[Path, list[str]]) -> None:
    root, arguments = trained
    finetuned = root / "finetuned"
    changes = ["seq_length=64", "max_position_embeddings=64", "train_iters=10", "lr_decay_iters=10",
               f"load={root / 'ckpt'}", f"save={finetuned}", "save_interval=10", "finetune=true", f"rope_scaling={YARN}"]
    kept = [word for word in arguments if word.split("=")[0] not in {change.split("=")[0] for change in changes}]
    done = run("train.py", *kept, *changes)
    assert "step     10/10" in done.stdout + done.stderr
    resolved = (finetuned / "global_step10" / "configs" / "resolved.yml").read_text()
    assert "rope_type: yarn" in resolved and "seq_length: 64" in resolved
    output = root / "finetuned.json"
    run("evaluate.py", "--load", str(finetuned), "--eval-lengths", "64,128", "--no-progress", "--output", str(output))
    result = json.loads(output.read_text())
    assert result["run"]["rope_scaling"] == json.loads(YARN) and result["run"]["train_seq_length"] == 64
