"""Training-step measurements: a real :class:`kerple.training.trainer.Trainer` on a synthetic
corpus, the time of one ``Trainer.train_step``, and the FLOPs per token that MFU counts.

FLOPs per token = 6*N + 12*L*h*s (PaLM, Appendix B): N = parameters that do matmuls (all but the
word and learned-position embedding tables; the LM head counted whether tied or not), L layers,
h hidden size, s sequence length. The attention term counts the full s x s score and value
products, as is customary, although causal kernels skip about half. Positional-embedding work is
not counted: it is what the throughput benchmarks charge to each embedding. :func:`check_embeddings`
refuses their unknown embedding names.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerple.errors import UsageError, did_you_mean
from kerple.measure.device import synchronize


def write_random_corpus(prefix: Path, vocab: int, tokens: int, seed: int = 0) -> None:
    """An indexed dataset of uniform random token documents (2048 tokens each) at ``prefix``;
    speed does not depend on the text."""
    from kerple.data.indexed_dataset import IndexedDatasetWriter

    rng = np.random.RandomState(seed)
    dtype = np.uint16 if vocab < 65500 else np.int32
    with IndexedDatasetWriter(prefix, dtype=dtype) as writer:
        for _ in range(max(tokens // 2048, 8)):
            writer.add_document(rng.randint(0, vocab, size=2048))
        writer.finalize()


def build_trainer(config_files: Sequence[str], overrides: dict[str, Any], name: str, corpus: str, total: int,
                  parallel: Any) -> Any:
    """A real Trainer for embedding ``name`` on the synthetic corpus (no saving, logging or validation)."""
    from kerple.config import load_config
    from kerple.training.trainer import Trainer

    cfg = load_config(
        list(config_files),
        {**overrides, "pos_emb": name, "data_path": corpus, "split": "100,0,0",
         "train_iters": total, "lr_decay_iters": total, "save": None, "load": None,
         "log_dir": None, "tensorboard_dir": None, "use_wandb": False, "eval_iters": 0},
    ).resolve_batch(1)
    with contextlib.redirect_stdout(io.StringIO()):
        return Trainer(cfg, parallel)


def measure_trainers(config_files: Sequence[str], overrides: dict[str, Any], names: Sequence[str],
                     micro_batches: Sequence[int], steps: int, warmup: int,
                     measure: Callable[[Any], Any]) -> list[tuple[str, int, Any]]:
    """``(embedding, micro-batch, measure(trainer) or the error's text)`` for every pair, each trainer
    (:func:`_trainers`) after ``warmup`` steps with its printing silenced; one failing case does not
    hide the others. ``steps``: the steps ``measure`` takes."""
    results: list[tuple[str, int, Any]] = []
    for name, micro, trainer in _trainers(config_files, overrides, names, micro_batches, steps + warmup):
        result = trainer  # the error's text when it could not be built
        if not isinstance(trainer, str):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    for _ in range(warmup):
                        trainer.train_step()
                result = measure(trainer)
            except Exception as error:
                result = _failure(error)
        results.append((name, micro, result))
        print(f"  measured {name} at micro-batch {micro}", file=sys.stderr, flush=True)
    return results


def _failure(error: Exception) -> str:
    """A case's error as its table cell shows it."""
    return f"{type(error).__name__}: {str(error)[:150]}"


def _trainers(config_files: Sequence[str], overrides: dict[str, Any], names: Sequence[str],
              micro_batches: Sequence[int], steps: int) -> Iterator[tuple[str, int, Any]]:
    """``(embedding, micro-batch, Trainer)`` for every pair, one at a time on one synthetic corpus
    of ``steps`` steps at the largest micro-batch, in a one-process group; each trainer is closed and
    its memory released before the next. A trainer that cannot be built comes as the error's text instead."""
    from kerple.config import load_config
    from kerple.measure.device import release
    from kerple.parallel.groups import init_distributed, teardown

    parallel = init_distributed(1, 1)
    try:
        base = load_config(list(config_files), dict(overrides))
        with tempfile.TemporaryDirectory() as tmp:
            need = steps * max(micro_batches) * (int(base.model.seq_length) + 1) * 2
            write_random_corpus(Path(tmp) / "corpus", int(base.model.vocab_size), need)
            for micro in micro_batches:
                for name in names:
                    settings = {**overrides, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1}
                    trainer = None
                    try:
                        trainer = build_trainer(config_files, settings, name, f"{tmp}/corpus", steps, parallel)
                    except Exception as error:
                        yield name, micro, _failure(error)
                        continue
                    try:
                        yield name, micro, trainer
                    finally:
                        trainer.close()
                        del trainer
                        release(parallel.device)
    finally:
        teardown(parallel)


def timed_step(trainer: Any, device: torch.device) -> float:
    """Seconds of one ``trainer.train_step()`` between device synchronizations."""
    synchronize(device)
    started = time.perf_counter()
    trainer.train_step()
    synchronize(device)
    return time.perf_counter() - started


def flops_per_token(model: torch.nn.Module, num_layers: int, hidden: int, seq_length: int) -> float:
    """``6*N + 12*L*h*s`` with N = matmul parameters (PaLM, Appendix B; see the module docstring)."""
    tables = {id(module.weight) for module in model.modules() if isinstance(module, torch.nn.Embedding)}
    matmul_params = sum(p.numel() for p in model.parameters() if id(p) not in tables)
    head = getattr(model, "lm_head_weight", None)
    if head is not None and id(head) in tables:  # tied: the word table is also the LM head's matmul
        matmul_params += head.numel()
    return 6 * matmul_params + 12 * num_layers * hidden * seq_length


def check_embeddings(flag: str, names: Sequence[str]) -> None:
    """Refuse, as a usage error, an embedding name the registry does not know, before the benchmarks
    build any model (a late one failed after the others had been timed)."""
    from kerple import positional

    for name in names:
        try:
            positional.canonical(name)
        except KeyError:
            raise UsageError(f"{flag}: {name!r} is not a positional embedding; {did_you_mean(name, positional.names())}choose "
                             f"from {', '.join(positional.names())}") from None
