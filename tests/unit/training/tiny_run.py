"""Helpers shared by the training tests: a synthetic indexed dataset, a tiny config, one-process runs.

The corpus is learnable (each document counts upwards modulo the vocabulary from a random start),
so a 2-layer model's loss falls within a few dozen steps. Integration tests import this file too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from kerple.config import Config, load_config
from kerple.data.indexed_dataset import IndexedDatasetWriter

REPO = Path(__file__).resolve().parents[3]
VOCAB = 64


def write_corpus(prefix: Path, documents: int = 200, seed: int = 0) -> Path:
    """``documents`` counting sequences of 20-120 tokens over a 63-token alphabet, then EOD 63."""
    rng = np.random.RandomState(seed)
    with IndexedDatasetWriter(prefix, dtype=np.uint16) as writer:
        for _ in range(documents):
            length = int(rng.randint(20, 120))
            start = int(rng.randint(0, VOCAB - 1))
            step = int(rng.choice([1, 2]))
            tokens = (start + step * np.arange(length)) % (VOCAB - 1)
            writer.add_document(np.append(tokens, VOCAB - 1))
        writer.finalize()
    return prefix


def tiny_overrides(data_prefix: Path, **overrides: Any) -> dict[str, Any]:
    """Overrides on configs/models/tiny.yml: seq 32, hidden 32, 4 heads, vocab 64, 30 steps."""
    values: dict[str, Any] = {
        "pos_emb": "kerple_log",
        "num_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "seq_length": 32,
        "max_position_embeddings": 64,
        "vocab_size": VOCAB,
        "make_vocab_size_divisible_by": 8,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "train_iters": 30,
        "lr_decay_iters": 30,
        "lr": 3e-3,
        "warmup": 0.05,
        "data_path": str(data_prefix),
        "split": "90,10,0",
        "eval_interval": 1000,
        "eval_iters": 1,
        "log_interval": 10,
        "save_interval": 1000,
        "keep_last_n_checkpoints": None,
        "seed": 1234,
        "save": None,
        "load": None,
        "log_dir": None,
        "tensorboard_dir": None,
    }
    values.update(overrides)
    return values


def tiny_config(data_prefix: Path, **overrides: Any) -> Config:
    return load_config([REPO / "configs/models/tiny.yml"], tiny_overrides(data_prefix, **overrides))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_two_ranks(script: Path, timeout: int = 400) -> None:
    """Run ``script`` on 2 CPU ranks with ``torch.distributed.run`` (gloo, 1 thread each), from a
    clean rank environment so no process group of this test process leaks in; assert it succeeded."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(free_port()), str(script)]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]


def single_process_group() -> Iterator[Any]:
    """A one-rank process group for in-process trainers (a generator for pytest fixtures)."""
    from kerple.parallel.groups import init_distributed, teardown

    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    saved = {key: os.environ.get(key) for key in keys}
    values = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    os.environ.update(values)
    parallel = init_distributed(1, 1)
    try:
        yield parallel
    finally:
        teardown(parallel)
        # later tests start subprocesses with os.environ: do not hand them this group's port
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def train(cfg: Config, parallel: Any) -> Any:
    """Build a Trainer on ``parallel``, train to the end, close it; returns the TrainResult."""
    from kerple.training.trainer import Trainer

    cfg.resolve_batch(parallel.world_size)
    trainer = Trainer(cfg, parallel)
    try:
        return trainer.train()
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def parallel() -> Iterator[Any]:
    """A one-process group for a test module (import this fixture by name)."""
    yield from single_process_group()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic corpus shared by a test module (import this fixture by name)."""
    return write_corpus(tmp_path_factory.mktemp("data") / "corpus")


def gather_vocab_parallel(logits: Any, parallel: Any) -> Any:
    """All-gather vocab-parallel ``logits [..., V/N]`` into ``[..., V]`` (to compare with one process)."""
    import torch

    if parallel.model_parallel_size == 1:
        return logits
    pieces = [torch.empty_like(logits) for _ in range(parallel.model_parallel_size)]
    torch.distributed.all_gather(pieces, logits.contiguous(), group=parallel.model_parallel_group)
    return torch.cat(pieces, dim=-1)
