"""lm-evaluation-harness on an exported folder gives evaluate.py's number on the same text.

What the two compute (docs/interop.md): lm-eval's ``loglikelihood_rolling`` scores each document on
its own, its first token after the prefix token (the tokenizer's BOS, here ``<|endoftext|>``), in
disjoint windows of ``max_length`` tokens (a last, partial window re-reads earlier tokens of the
same document); evaluate.py's ``nonoverlap`` protocol scores one token stream in disjoint windows
of L. They are the same sum of token log-likelihoods when the stream is
``<|endoftext|> d1 <|endoftext|> d2 <|endoftext|> ...`` and every document with its closing
``<|endoftext|>`` fills whole windows of L = ``max_length``: here documents of 15, 31 and 15 tokens
and L = 16. lm-eval's documents are therefore ``text<|endoftext|>`` (the end of text is scored, as
in the stream), and kerple's corpus is the same texts with the default ``--append-eod`` and one
``<|endoftext|>`` before the first. lm-eval reports per word and per byte; the total
log-likelihood, read back from ``bits_per_byte`` and per document from the logged samples, is
compared with evaluate.py's loss times its scored tokens.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("lm_eval", reason="lm-eval is not installed (optional: pip install -c requirements/constraints.txt -r requirements/eval.txt)")

from kerple.checkpoint import NeoxAdapter  # noqa: E402
from kerple.checkpoint.architecture import architecture_args  # noqa: E402
from kerple.checkpoint.convert import main as convert_main  # noqa: E402
from kerple.checkpoint.writer import write_checkpoint  # noqa: E402
from kerple.config import load_config  # noqa: E402
from kerple.data.preprocess import main as prepare_main  # noqa: E402
from kerple.data.tokenizers import EOD_TEXT, train_bpe_tokenizer  # noqa: E402
from kerple.evaluation.cli import main as evaluate_main  # noqa: E402
from kerple.model import build_model  # noqa: E402

WINDOW = 16
WORDS = (
    "the kernel of a relative position bias decays with distance so that attention prefers recent keys "
    "while long contexts still help the model read"
).split()
# lm-eval's Python API with built-in tasks left unindexed (indexing them takes ~17 s); the same run as
# `lm-eval run --model hf --model_args ... --tasks kerple_docs --include_path TASKS`
LM_EVAL = """
import json, sys
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
folder, tasks, window, out = sys.argv[1:]
args = {"pretrained": folder, "trust_remote_code": True, "dtype": "float32", "max_length": int(window)}
run = simple_evaluate(model="hf", model_args=args, tasks=["kerple_docs"], device="cpu", batch_size=1,
                      task_manager=TaskManager(include_path=tasks, include_defaults=False), log_samples=True)
samples = [{"doc_id": s["doc_id"], "loglikelihood": float(s["filtered_resps"][0])} for s in run["samples"]["kerple_docs"]]
json.dump({"results": run["results"]["kerple_docs"], "samples": samples}, open(out, "w"))
"""


def _documents(tokenizer) -> list[str]:
    """Three texts of 15, 31 and 15 tokens (one word is one token of this tokenizer)."""
    texts = [" ".join((WORDS * 3)[start : start + count]) for start, count in ((0, WINDOW - 1), (5, 2 * WINDOW - 1), (11, WINDOW - 1))]
    assert [len(tokenizer.tokenize(text)) for text in texts] == [WINDOW - 1, 2 * WINDOW - 1, WINDOW - 1]
    return texts


def _checkpoint(work: Path, settings: dict) -> Path:
    """A tiny kerple_log model with every weight moved off its initialisation, as a kerple checkpoint."""
    cfg = load_config([], settings)
    torch.manual_seed(3)
    model = build_model(cfg, flex_compile=False)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.2)
    state = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    config_file = {"config.yml": yaml.safe_dump(cfg.to_dict(), sort_keys=False)}
    return write_checkpoint(work / "ckpt", state, iteration=1, args=architecture_args(cfg), config_files=config_file)


def _lm_eval(work: Path, folder: Path, texts: list[str]) -> dict:
    task = {
        "task": "kerple_docs",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(work / "docs.jsonl")}},
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{text}}" + EOD_TEXT,
        "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}],
    }
    (work / "docs.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    (work / "tasks").mkdir()
    (work / "tasks" / "kerple_docs.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    env = {**os.environ, "HF_HOME": str(work / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", LM_EVAL, str(folder), str(work / "tasks"), str(WINDOW), str(work / "lm_eval.json")]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((work / "lm_eval.json").read_text())


def test_lm_eval_rolling_loglikelihood_equals_evaluate_py_nonoverlap(tmp_path, one_thread):
    tokenizer = train_bpe_tokenizer([" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 10, 400, tmp_path / "tokenizer.json")
    texts = _documents(tokenizer)
    corpus = tmp_path / "corpus.jsonl"  # the same texts; the stream starts at a document boundary
    corpus.write_text("".join(json.dumps({"text": (EOD_TEXT if i == 0 else "") + text}) + "\n" for i, text in enumerate(texts)))
    prefix = tmp_path / "data" / "docs"
    assert prepare_main(["--input", str(corpus), "--output-prefix", str(prefix), "-t", "HFTokenizer",
                         "--tokenizer-file", str(tokenizer.tokenizer_file), "--split", "0,100,0", "--quiet"]) == 0
    settings = {
        "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": WINDOW, "pos_emb": "kerple_log",
        "vocab_size": tokenizer.vocab_size, "make_vocab_size_divisible_by": 8, "no_weight_tying": True,
        "tokenizer_type": "HFTokenizer", "vocab_file": str(tokenizer.tokenizer_file),
        "data_path": f"{prefix}_text_document", "split": "0,100,0",
    }
    checkpoint = _checkpoint(tmp_path, settings)
    (tmp_path / "run.yml").write_text(yaml.safe_dump(settings))
    scored = len(texts) + sum(len(tokenizer.tokenize(text)) for text in texts)  # every token and each closing EOD
    assert evaluate_main([str(tmp_path / "run.yml"), "--load", str(checkpoint), "--eval-lengths", str(WINDOW),
                          "--num-tokens", str(scored), "--per-document", "--output", str(tmp_path / "eval.json"),
                          "--no-progress"]) == 0
    (kerple,) = json.loads((tmp_path / "eval.json").read_text())["results"]
    assert convert_main([str(checkpoint), str(tmp_path / "hf"), "--to", "hf"]) == 0  # tokenizer from the run's config
    harness = _lm_eval(tmp_path, tmp_path / "hf", texts)

    assert kerple["scored_tokens"] == scored
    total_bytes = sum(len((text + EOD_TEXT).encode("utf-8")) for text in texts)
    harness_nll = harness["results"]["bits_per_byte,none"] * math.log(2) * total_bytes
    assert harness_nll == pytest.approx(kerple["loss"] * scored, rel=1e-6)
    per_document = {row["document"]: row["loss"] * row["tokens"] for row in kerple["per_document"]}
    assert {s["doc_id"]: -s["loglikelihood"] for s in harness["samples"]} == pytest.approx(per_document, rel=1e-6)
    words = sum(len(text.split()) for text in texts)  # lm-eval's count: the EOD is glued to the last word
    assert harness["results"]["word_perplexity,none"] == pytest.approx(math.exp(kerple["loss"] * scored / words), rel=1e-5)


REPO = Path(__file__).resolve().parents[2]
SHIPPED_TASK = """
import json, sys
from lm_eval.tasks import TaskManager, get_task_dict
task = get_task_dict(["my_docs"], TaskManager(include_path="tasks", include_defaults=False))["my_docs"]
json.dump([doc["text"] for doc in task.test_docs()], open(sys.argv[1], "w"))
"""


def test_the_readmes_lm_eval_task_is_shipped_and_loads_offline(tmp_path):
    """The command's `--include_path tasks/` named a folder that did not exist (the YAML was only in
    docs/interop.md)."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", SHIPPED_TASK, str(tmp_path / "docs.json")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shipped = [json.loads(line)["text"] for line in (REPO / "tasks/my_docs.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "docs.json").read_text()) == shipped and len(shipped) == 3
