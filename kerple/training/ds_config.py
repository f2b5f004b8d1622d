"""The DeepSpeed JSON config emitted from a resolved :class:`kerple.config.Config`.

The batch triple, gradient clipping, the ZeRO block and the precision block (bf16, or fp16 with
dynamic loss scaling) come from the config's own keys; the other DeepSpeed blocks and keys that a
GPT-NeoX config may hold (``scheduler``, ``flops_profiler``, ``data_types``, ``comms_logger``, the
keys of ``deepspeed_extra_args``, ...) are passed on as written (``cfg.deepspeed``). The optimizer
and the LR schedule are passed to ``deepspeed.initialize`` as objects (see
:mod:`kerple.training.optimizer`, :mod:`kerple.training.schedule`); DeepSpeed then uses them
rather than a ``scheduler`` block. This project writes its own checkpoints
(:mod:`kerple.checkpoint`). ``steps_per_print`` is set high because the trainer prints its
own progress lines.

Precision and clipping on the single-replica layout (ZeRO stage 0, no pipeline), the one a
single-GPU run takes, in fp32 and bf16: DeepSpeed gets no ``bf16`` block and no
``gradient_clipping``, and steps the optimizer it is given as a plain torch optimizer,
:class:`kerple.training.master_adamw.MasterAdamW`, which keeps the fp32 master weights of a bf16
model and clips by the global gradient norm itself, a few foreach kernels per step. (DeepSpeed's
``bf16`` block at ZeRO 0 would wrap the optimizer in its unfused fp16/bf16 optimizer: an fp32
copy, an overflow check and a norm per parameter, each check and norm a host synchronization.)
bf16 has fp32's exponent range and trains without a loss scale, so it needs no overflow check: a
non-finite loss stops the run instead (:class:`kerple.training.trainer.Trainer`).

ZeRO 1-3 and pipeline runs keep DeepSpeed's ``bf16`` block, written with
``check_grad_overflow: false`` unless the config sets it, and DeepSpeed's clipping. fp16 keeps
DeepSpeed's dynamic loss scaling and its overflow check everywhere.
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

# Further keys of DeepSpeed 0.19.8's fp16 and bf16 blocks with DeepSpeed's defaults; each is
# written only when the config differs from the default.
FP16_OPTIONS = {"auto_cast": False, "consecutive_hysteresis": False, "fp16_master_weights_and_grads": False}
BF16_OPTIONS = {
    "immediate_grad_update": False,
    "check_grad_overflow": True,  # the config's default is false (see the module docstring)
    "bf16_master_weights_and_grads": False,
    "bf16_optimizer_states": False,
}

# cfg.deepspeed keys passed on as written when they differ from their defaults.
PASSED_ON = (
    "scheduler",
    "prescale_gradients",
    "gradient_predivide_factor",
    "communication_data_type",
    "dump_state",
    "flops_profiler",
    "autotuning",
    "activation_checkpointing",
    "data_efficiency",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comms_logger",
    "checkpoint",
    "data_types",
)
PASSED_ON_DEFAULTS = {"prescale_gradients": False, "gradient_predivide_factor": 1.0}


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

    own_step = optimizer_steps_itself(cfg)
    ds: dict[str, Any] = {
        "train_batch_size": micro * accumulation * data_parallel_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 0.0 if own_step else float(_field(training, "gradient_clipping", 0.0)),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer is on by default and synchronizes the device when a forward
        # starts and when a step ends: two waits per step that keep the host from queueing the next
        # step's kernels (profiled on an H200: the GPU idle half of each 162M step). The trainer
        # measures its own throughput from its log interval.
        "timers": {"throughput": {"enabled": False}},
        # torch.optim.AdamW is on DeepSpeed's ZeRO list; this only silences the check for others.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": _zero_block(cfg, zero_stage),
    }
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision {precision!r} is not one of fp32, bf16, fp16")
    if precision == "bf16" and not own_step:  # with its own step the optimizer holds the masters
        ds["bf16"] = {"enabled": True, **_changed(cfg.precision, BF16_OPTIONS)}
    elif precision == "fp16":
        block = {"enabled": True}
        for name, default in LOSS_SCALE_DEFAULTS.items():
            block[name] = _field(cfg.precision, name, default)
        ds["fp16"] = {**block, **_changed(cfg.precision, FP16_OPTIONS)}
    passed = getattr(cfg, "deepspeed", None)
    if passed is not None:
        for name in PASSED_ON:
            value = getattr(passed, name)
            if value not in (None, {}) and value != PASSED_ON_DEFAULTS.get(name):
                ds[name] = value
        ds.update(passed.deepspeed_extra_args)  # kerple's config check keeps these off the keys above
    return ds


def optimizer_steps_itself(cfg: Any) -> bool:
    """Whether ``cfg``'s run trains with :class:`~kerple.training.master_adamw.MasterAdamW` (fp32 or bf16
    at ZeRO stage 0 without a pipeline), which holds the master weights and clips, rather than with
    DeepSpeed's precision wrappers and clipping."""
    parallelism = cfg.parallelism
    return (str(cfg.precision.precision) in ("fp32", "bf16") and int(_field(parallelism, "zero_stage", 0)) == 0
            and max(int(_field(parallelism, "pipe_parallel_size", 1)), 1) == 1)


def _changed(section: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``defaults`` whose configured value differs from DeepSpeed's default."""
    values = {name: getattr(section, name, default) for name, default in defaults.items()}
    return {name: value for name, value in values.items() if value != defaults[name]}
