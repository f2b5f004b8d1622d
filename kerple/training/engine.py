"""This rank's model and its DeepSpeed engine, for every parallel layout the trainer supports.

* Tensor parallelism (``model_parallel_size: N``): the model is built whole (so with a given seed
  every N starts from the same weights) and :func:`kerple.parallel.tensor_parallel.parallelize`
  keeps this rank's slice; the loss is the vocab-parallel cross entropy.
* Pipeline parallelism (``pipe_parallel_size > 1``): the loaded whole model becomes this rank's
  stages (:func:`kerple.parallel.pipeline.build_pipeline`) before the optimizer is built, and
  DeepSpeed returns its pipeline engine.
* ZeRO stage 3 (non-pipeline, ``model_parallel_size: 1``) partitions the parameters themselves over
  the data-parallel ranks. Parameters read outside their own module's ``forward`` (the shared
  positional parameters behind the distance tables, the LM-head weight) are registered as external
  parameters of the model so DeepSpeed gathers them for its forward and backward (DeepSpeed 0.19
  would also gather them on first attribute access; the explicit registration is its documented
  route and does not depend on that fallback). Reading them elsewhere goes through :func:`gathered`.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from kerple.training import loss as loss_module
from kerple.training.ds_config import deepspeed_config
from kerple.training.loss import LanguageModelLoss


def build_rank_model(cfg: Any, parallel: Any) -> nn.Module:
    """``cfg``'s model, reduced to this rank's tensor-parallel slice when ``model_parallel_size > 1``."""
    from kerple.model import build_model

    model = build_model(cfg)
    if parallel.model_parallel_size > 1:
        from kerple.parallel.tensor_parallel import parallelize

        model = parallelize(model, cfg, parallel)
    return model


def build_stages(model: nn.Module, parallel: Any) -> nn.Module:
    """This rank's pipeline stages of the whole (loaded) ``model``."""
    from kerple.parallel.pipeline import build_pipeline

    return build_pipeline(model, parallel.pipe_parallel_size, loss_module.cross_entropy)


def gathered(parameters: list[nn.Parameter], zero3: bool) -> Any:
    """Under ZeRO-3, a collective context in which ``parameters`` hold their full values (read
    only); otherwise a no-op. Every rank must enter it."""
    if not zero3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(parameters, modifier_rank=None)


def initialize_engine(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, cfg: Any, parallel: Any) -> Any:
    """``deepspeed.initialize`` for this rank's ``model`` (moved to the rank's device first).

    A pipeline (``PipelineModule``) gets DeepSpeed's pipeline engine, which takes its groups from the
    module; any other model is wrapped with its loss (:class:`LanguageModelLoss`): the LM head fused
    with the cross entropy, or the vocab-parallel cross entropy of the split logits.
    """
    import deepspeed

    ds_config = deepspeed_config(cfg, data_parallel_size=parallel.data_parallel_size)
    model.to(parallel.device)
    common = {"optimizer": optimizer, "lr_scheduler": scheduler, "config": ds_config, "dist_init_required": False}
    if max(int(cfg.parallelism.pipe_parallel_size), 1) > 1:
        engine, _, _, _ = deepspeed.initialize(model=model, **common)
        return engine
    if int(cfg.parallelism.zero_stage) == 3:
        _register_external_parameters(model)
    loss_fn = None  # the model's LM head fused with the loss
    if parallel.model_parallel_size > 1:
        from kerple.parallel.tensor_parallel import vocab_parallel_loss

        loss_fn = vocab_parallel_loss  # the LM head's logits are split by vocabulary
    mpu = parallel if parallel.model_parallel_size > 1 else None
    engine, _, _, _ = deepspeed.initialize(model=LanguageModelLoss(model, loss_fn), mpu=mpu, **common)
    return engine


def _register_external_parameters(model: nn.Module) -> None:
    """ZeRO-3 gathers a module's own parameters around its ``forward``; the model's forward also
    reads some parameters outside their owner's forward (the shared positional parameters, the
    LM-head weight: :meth:`~kerple.model.Decoder.shared_parameters`), so they are registered with
    ``deepspeed.zero.register_external_parameter`` on the model."""
    import deepspeed

    external = model.shared_parameters()
    for parameter in {id(p): p for p in external}.values():
        deepspeed.zero.register_external_parameter(model, parameter)
