"""The DeepSpeed JSON config emitted from a resolved :class:`kerple.config.Config`.

Only what DeepSpeed needs to drive the optimizer step goes in: the batch triple, gradient
clipping, the ZeRO block and the precision block (bf16, or fp16 with dynamic loss scaling). The
optimizer and the LR schedule are passed to ``deepspeed.initialize`` as objects (see
:mod:`kerple.training.optimizer`, :mod:`kerple.training.schedule`), and this project writes its own
checkpoints (:mod:`kerple.checkpoint`), so neither appears here. ``steps_per_print`` is set
high because the trainer prints its own progress lines.
"""

from __future__ import annotations

from typing import Any

# DeepSpeed's own defaults for dynamic loss scaling, used when the config leaves a field unset.
LOSS_SCALE_DEFAULTS = {
    "loss_scale": 0.0,  # 0 means dynamic
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1.0,
}


def _field(section: Any, name: str, default: Any) -> Any:
    value = getattr(section, name, None)
    return default if value is None else value


def _zero_block(cfg: Any, stage: int) -> dict[str, Any]:
    """The config's ``zero_optimization`` block over this project's defaults (no comm overlap:
    it only helps on GPUs and changes reduction order)."""
    block: dict[str, Any] = {
        "contiguous_gradients": stage > 0,
        "overlap_comm": False,
        "reduce_scatter": True,
        "allgather_partitions": True,
    }
    block.update(dict(_field(cfg.parallelism, "zero_optimization", {}) or {}))
    block["stage"] = stage
    return block


def deepspeed_config(cfg: Any, *, data_parallel_size: int) -> dict[str, Any]:
    """Build the ds_config dict for ``cfg`` on a run with ``data_parallel_size`` replicas.

    ``train_batch_size = micro_batch_size * gradient_accumulation_steps * data_parallel_size``
    (docs/reference-format.md §5); DeepSpeed checks the triple again at initialisation.
    """
    training = cfg.training
    micro = int(training.micro_batch_size)
    accumulation = int(training.gradient_accumulation_steps)
    precision = str(cfg.precision.precision)
    zero_stage = int(_field(cfg.parallelism, "zero_stage", 0))

    ds: dict[str, Any] = {
        "train_batch_size": micro * accumulation * data_parallel_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": float(_field(training, "gradient_clipping", 0.0)),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # torch.optim.AdamW is on DeepSpeed's ZeRO list; this only silences the check for others.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": _zero_block(cfg, zero_stage),
    }
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif precision == "fp16":
        block = {"enabled": True}
        for name, default in LOSS_SCALE_DEFAULTS.items():
            block[name] = _field(cfg.precision, name, default)
        ds["fp16"] = block
    elif precision != "fp32":
        raise ValueError(f"precision {precision!r} is not one of fp32, bf16, fp16")
    return ds
