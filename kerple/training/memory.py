"""What a training run needs in memory at least, checked before it starts.

A run whose micro-batch cannot fit is otherwise killed by the kernel (or CUDA) at its first step,
with no word. :func:`training_memory` is a *lower bound* per process, so that a refusal is never
wrong: the model states (weights and gradients in the parameters' dtype, Adam's two fp32 moments and
the fp32 master copy of a 16-bit run, the optimizer part split over data-parallel ranks under ZeRO),
the activations a layer keeps for the backward pass, and the logits the loss reads: one chunk of fp32
logits for the fused LM-head loss of a single-stage, single-slice model
(:func:`kerple.model.lm_loss.linear_cross_entropy`), else the whole ``[b, s, V]`` output with the fp32
log-softmax its cross entropy keeps for the backward.

Activations per layer: Korthikanti et al. 2022 (arXiv 2205.05198, §4.1) count 34·s·b·h bytes in
16-bit precision, plus 5·a·s²·b for attention scores kept by a kernel that materialises them (eager);
the bound here takes 8 hidden-sized tensors per token (their count, 17 tensors, halved; dropout masks
left out) and, with eager attention, the softmax output alone. With ``checkpoint_activations`` only
each group's input is kept, plus one group's activations while it is recomputed.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from kerple.model.lm_loss import chunk_tokens_for
from kerple.training.errors import TrainingError

SAVED_HIDDEN_TENSORS = 8
"""Hidden-sized tensors per token a transformer layer keeps for its backward, at least."""
GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one process needs at least: model states, activations per sample, logits per sample."""

    states: int
    activations_per_sample: int
    logits_per_sample: int
    micro_batch: int

    @property
    def total(self) -> int:
        return self.states + self.micro_batch * (self.activations_per_sample + self.logits_per_sample)

    def largest_micro_batch(self, available: int) -> int:
        """The largest micro-batch whose bound fits ``available`` bytes (0: not even one sample)."""
        per_sample = self.activations_per_sample + self.logits_per_sample
        return max(0, (available - self.states) // max(per_sample, 1))


def parameter_count(cfg: Any) -> int:
    """Parameters of the config's model, counted on the meta device (nothing allocated)."""
    from kerple.model import build_model

    with torch.device("meta"):
        model = build_model(cfg, flex_compile=False)
    return sum(p.numel() for p in model.parameters())


def training_memory(cfg: Any, parameters: int, data_parallel: int = 1) -> MemoryEstimate:
    """The lower bound of :mod:`this module <kerple.training.memory>` for one process of ``cfg``."""
    model, training, parallel = cfg.model, cfg.training, cfg.parallelism
    sixteen_bit = cfg.precision.precision in ("bf16", "fp16")
    width = 2 if sixteen_bit else 4
    model_parallel = int(parallel.model_parallel_size)
    stages = max(int(parallel.pipe_parallel_size), 1)
    local = parameters / (model_parallel * stages)
    optimizer = 8 + (4 if sixteen_bit else 0)  # Adam's moments, the fp32 master copy
    zero = int(parallel.zero_stage)
    states = local * (2 * width / (data_parallel if zero >= 3 else 1) + optimizer / (data_parallel if zero >= 1 else 1))
    seq, hidden = int(model.seq_length), int(model.hidden_size)
    layer = SAVED_HIDDEN_TENSORS * seq * hidden * width / model_parallel
    if cfg.attention.attention_impl == "eager":
        layer += int(model.num_attention_heads) * seq * seq * width / model_parallel  # the softmax output
    layers = math.ceil(int(model.num_layers) / stages)
    if training.checkpoint_activations:
        group = min(int(training.checkpoint_num_layers), layers)
        activations = layers * seq * hidden * width + group * layer
    else:
        activations = layers * layer
    vocab = int(model.padded_vocab_size)
    if model_parallel == 1 and stages == 1:  # the fused loss: one chunk of fp32 logits at a time, whatever the batch
        tokens = seq * int(training.micro_batch_size)
        states += chunk_tokens_for(tokens, vocab) * vocab * 4
        logits = 0.0
    else:  # the whole [b, s, V] output, and the fp32 log-softmax its cross entropy keeps
        logits = seq * vocab * (width + 4) / model_parallel
    return MemoryEstimate(int(states), int(activations), int(logits), int(training.micro_batch_size))


def available_memory(device: torch.device, processes_here: int) -> tuple[int, str]:
    """Bytes this process may use, and what they are: the device's free memory on CUDA; the
    machine's available RAM shared by the ``processes_here`` ranks on this node otherwise."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0]), f"free on {device}"
    import psutil

    share = f" (shared by {processes_here} processes)" if processes_here > 1 else ""
    return int(psutil.virtual_memory().available) // max(processes_here, 1), f"of available RAM{share}"


def check_training_memory(cfg: Any, parallel: Any) -> None:
    """Refuse (:class:`TrainingError`, one line naming the keys to change) a run whose lower bound
    exceeds the memory this process has; a change is named only where its bound would fit."""
    parameters = parameter_count(cfg)
    estimate = training_memory(cfg, parameters, parallel.data_parallel_size)
    here = int(os.environ.get("LOCAL_WORLD_SIZE", parallel.world_size if parallel.device.type == "cpu" else 1))
    available, what = available_memory(parallel.device, here)
    if estimate.total <= available:
        return
    fits = estimate.largest_micro_batch(available)
    fixes = []
    if fits >= 1:
        fixes.append(f"micro_batch_size well under {fits + 1}, where this lower bound reaches the memory "
                     "(gradient_accumulation_steps keeps the batch)")
    for section, key, value, shown in (("training", "checkpoint_activations", True, "checkpoint_activations: true"),
                                       ("attention", "attention_impl", "sdpa", "attention_impl: sdpa")):
        changed = copy.deepcopy(cfg)
        setattr(getattr(changed, section), key, value)
        if getattr(getattr(cfg, section), key) != value and training_memory(changed, parameters,
                                                                            parallel.data_parallel_size).total <= available:
            fixes.append(shown)
    if not fixes and estimate.states >= available:
        fixes.append("a smaller hidden_size or num_layers (the weights, gradients and Adam states alone do not fit), "
                     "or more data-parallel processes with zero_stage: 1-3 to shard them")
    elif not fixes:
        fixes.append("a shorter seq_length (one sample does not fit)")
    needed = estimate.micro_batch * (estimate.activations_per_sample + estimate.logits_per_sample)
    raise TrainingError(
        f"micro_batch_size {estimate.micro_batch} x seq_length {cfg.model.seq_length} needs at least "
        f"{estimate.total / GIB:.1f} GiB per process (activations and logits {needed / GIB:.1f} GiB, model and "
        f"optimizer states {estimate.states / GIB:.1f} GiB) but has {available / GIB:.1f} GiB {what}; "
        f"set {', or '.join(fixes)}"
    )
