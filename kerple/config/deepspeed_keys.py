"""What DeepSpeed 0.19.8 accepts inside the config blocks that GPT-NeoX passes to it.

DeepSpeed validates some blocks strictly (pydantic models that forbid unknown keys): ``fp16``,
``bf16``, ``zero_optimization`` and the monitors. The key lists below are those models' field
names and aliases in DeepSpeed 0.19.8 for the blocks kerple keeps whole (``fp16`` and ``bf16`` are
one config field per key instead, :class:`kerple.config.sections.PrecisionConfig`);
``tests/unit/config/test_deepspeed_blocks.py`` compares both with the installed DeepSpeed so that
an upgrade cannot drift silently. A block listed here is checked when the config loads, so a typo
fails before any model is built.

DeepSpeed 0.19.8 also raises on a few top-level blocks that GPT-NeoX still declares, because the
features were removed from DeepSpeed (``_REMOVED_TOP_LEVEL_CONFIG_KEYS`` in
``deepspeed/runtime/config.py``). kerple accepts them while they are switched off and never passes
them on; :data:`REMOVED_BLOCKS` says why each one is refused when it is switched on.
"""

from __future__ import annotations

ZERO_KEYS = (
    "stage",
    "contiguous_gradients",
    "reduce_scatter",
    "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce",
    "allgather_partitions",
    "allgather_bucket_size",
    "overlap_comm",
    "compute_grad_norm",
    "load_from_fp32_weights",
    "elastic_checkpoint",
    "offload_param",
    "offload_optimizer",
    "zenflow",
    "sub_group_size",
    "cpu_offload_param",
    "cpu_offload_use_pin_memory",
    "cpu_offload",
    "prefetch_bucket_size",
    "stage3_prefetch_bucket_size",
    "param_persistence_threshold",
    "stage3_param_persistence_threshold",
    "model_persistence_threshold",
    "stage3_model_persistence_threshold",
    "max_live_parameters",
    "stage3_max_live_parameters",
    "max_reuse_distance",
    "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save",
    "module_granularity_threshold",
    "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params",
    "stage3_use_all_reduce_for_fetch_params",
    "allgather_sequential",
    "stage3_allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save",
    "ignore_unused_parameters",
    "legacy_stage1",
    "round_robin_gradients",
    "parameter_alignment",
    "zero_hpz_partition_size",
    "zero_quantized_weights",
    "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients",
    "memory_efficient_linear",
    "pipeline_loading_checkpoint",
    "override_module_apply",
    "log_trace_cache_warnings",
    "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory",
    "leaf_module",
)
"""``DeepSpeedZeroConfig`` fields and their ``stage3_*`` aliases (``deepspeed/runtime/zero/config.py``)."""

MONITOR_KEYS = ("enabled", "output_path", "job_name")
"""``TensorBoardConfig`` and ``CSVConfig`` fields (``deepspeed/monitor/config.py``)."""

WANDB_KEYS = ("enabled", "group", "team", "project")
"""``WandbConfig`` fields."""

COMMS_LOGGER_KEYS = ("enabled", "prof_all", "prof_ops", "verbose", "debug")
"""``CommsLoggerConfig`` fields (``deepspeed/comm/config.py``)."""

REMOVED_BLOCKS = {
    "amp": "NVIDIA Apex AMP (removed from DeepSpeed 0.19.8); use the fp16 or bf16 block",
    "elasticity": "elastic training (removed from DeepSpeed 0.19.8); set the batch sizes directly",
    "curriculum_learning": "sequence-length curriculum learning (removed from DeepSpeed 0.19.8)",
    "compression_training": "DeepSpeed compression, which quantizes or prunes the model (removed from DeepSpeed 0.19.8)",
    "sparse_attention": "DeepSpeed sparse attention (removed from DeepSpeed 0.19.8)",
}
"""GPT-NeoX blocks that DeepSpeed 0.19.8 refuses: the feature each one switches on."""

WRITTEN_BY_KERPLE = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "steps_per_print",
    "wall_clock_breakdown",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "zero_optimization",
    "fp16",
    "bf16",
    "optimizer",
)
"""Top-level DeepSpeed keys that :func:`kerple.training.ds_config.deepspeed_config` derives from
the config itself; ``deepspeed_extra_args`` may not set them a second time."""
