"""Which samples each rank reads at each micro-step, derived from the consumed-sample count alone.

The reference's ``MegatronPretrainingSampler`` walks the (already shuffled) ``GPT2Dataset``
sequentially; so does this feed. Global step ``n`` reads samples
``[consumed, consumed + global_batch)`` where ``consumed = n * global_batch``; inside it, micro-step
``m`` of data-parallel rank ``r`` reads the ``micro_batch`` samples starting at
``consumed + (m * dp + r) * micro_batch``. Because the position is a pure function of
``consumed_train_samples``, storing that one number in the checkpoint resumes the data exactly,
and a 2-rank run sees the same samples per optimizer step as a 1-rank run with the same global
batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kerple.data.errors import DataError


class DataTooShortError(DataError):
    """The dataset provides fewer samples than the run needs."""


@dataclass
class BatchFeed:
    dataset: Any
    micro_batch_size: int
    accumulation_steps: int
    data_parallel_size: int
    data_parallel_rank: int
    device: torch.device
    eod_token: int | None = None  # set when eod_mask_loss: labels after an EOD are ignored

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.accumulation_steps * self.data_parallel_size

    def check_length(self, samples_needed: int, what: str) -> None:
        available = len(self.dataset)
        if available < samples_needed:
            raise DataTooShortError(
                f"the {what} dataset has {available} samples but the run needs {samples_needed}; "
                "lower train_iters/eval_iters or the batch size, or use more data"
            )

    def micro_batch(self, consumed: int, micro_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, labels)``, each int64 ``[micro_batch, seq_len]`` on the feed's device."""
        start = consumed + (micro_step * self.data_parallel_size + self.data_parallel_rank) * self.micro_batch_size
        rows = [np.asarray(self.dataset[start + i]["text"], dtype=np.int64) for i in range(self.micro_batch_size)]
        text = to_device(torch.from_numpy(np.stack(rows)), self.device)  # [b, s + 1]
        tokens, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
        if self.eod_token is not None:
            # the reference's eod_mask_loss: do not predict the token that follows an EOD
            labels = labels.masked_fill(tokens == self.eod_token, -100)
        return tokens, labels


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device`` without holding up the host. A copy from pageable memory lets the CUDA
    driver wait for the stream's queued work before it stages the bytes (the runtime API's
    synchronization rules for ``cudaMemcpyAsync``), so every step would start only when the previous
    one had drained the device; from pinned memory (PyTorch's caching host allocator, which keeps the
    block until the copy is done) the copy is queued like a kernel."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def build_feeds(cfg: Any, parallel: Any) -> tuple[BatchFeed | None, BatchFeed | None]:
    """The training and validation feeds of ``cfg`` for this rank (``None`` where a split is empty).

    Rank 0 builds (and caches) the datasets' index maps first; the other ranks then read the cache.
    """
    from kerple.data.gpt2_dataset import build_datasets_from_config, neox_num_samples
    from kerple.data.tokenizers import check_vocabulary_fits
    from kerple.training.errors import TrainingError

    check_vocabulary_fits(cfg)

    training = cfg.training
    micro, accumulation = int(training.micro_batch_size), int(training.gradient_accumulation_steps)
    train_iters = int(training.train_iters)
    global_batch = micro * accumulation * parallel.data_parallel_size
    train_samples, valid_samples, _test = neox_num_samples(train_iters, global_batch, int(training.eval_interval),
                                                           int(training.eval_iters))
    num_samples = (train_samples, valid_samples, 0)  # the trainer never reads the test split: it is evaluate.py's
    if parallel.is_main:
        datasets = build_datasets_from_config(cfg, num_samples)
    parallel.barrier()
    if not parallel.is_main:
        datasets = build_datasets_from_config(cfg, num_samples)
    if datasets.train is None and train_iters > 0:
        raise TrainingError(_no_training_data(cfg))
    if datasets.valid is None and num_samples[1] > 0 and parallel.is_main:
        logging.getLogger(__name__).warning("warning: %s", _no_validation_data(cfg))
    eod = _eod_token(cfg.data) if cfg.data.eod_mask_loss else None
    train, valid = (
        None if dataset is None
        else BatchFeed(dataset, micro, accumulation, parallel.data_parallel_size, parallel.data_parallel_rank, parallel.device, eod)
        for dataset in (datasets.train, datasets.valid)
    )
    if train is not None:
        train.check_length(num_samples[0], "training")
    return train, valid


def _no_validation_data(cfg: Any) -> str:
    """Why this run has no validation data, and what gives it some."""
    data = cfg.data
    if data.train_data_paths:  # separate files: the split string is not read
        return ("no valid_data_paths are set beside train_data_paths: this run trains without validation. "
                "Set valid_data_paths (and valid_data_weights for several)")
    return (f"the validation split of {data.data_path} is empty (split {data.split!r} leaves it no documents): this "
            "run trains without validation. Use a larger corpus, a larger second weight in 'split', or "
            "'valid_data_paths'")


def _no_training_data(cfg: Any) -> str:
    """Why a run has no training samples, and the fix."""
    data = cfg.data
    if data.valid_data_paths or data.test_data_paths:
        return ("valid_data_paths/test_data_paths are set but train_data_paths is not: set train_data_paths "
                "(GPT-NeoX needs all three), or set all three to null to split data_path")
    return (f"split {data.split!r} ({cfg.provenance('data.split')[0]}) gives the training part of {data.data_path} "
            "no documents; give its first weight a share (e.g. '969,30,1')")


def _eod_token(data: Any) -> int:
    from kerple.data.tokenizers import build_tokenizer

    return build_tokenizer(data.tokenizer_type, data.vocab_file, data.merge_file, data.tokenizer_file).eod
