"""DeepSpeed blocks of GPT-NeoX configs: every key DeepSpeed 0.19.8 accepts loads and reaches the
DeepSpeed config as written; the fork's fp16 block spellings; blocks DeepSpeed removed."""

from __future__ import annotations

import pytest

from kerple.config import ConfigError, load_config
from kerple.config import deepspeed_keys as keys
from kerple.config.neox_keys import FIELDS
from kerple.training.ds_config import deepspeed_config

BATCH = "train_micro_batch_size_per_gpu: 4\n"


def ds_of(write, text: str) -> dict:
    cfg = load_config([write("ds.yml", BATCH + text)]).resolve_batch(1)
    return deepspeed_config(cfg, data_parallel_size=1)


GPT_NEOX_FP16_KEYS = {"type", "fp16"}  # the KERPLE fork's own fp16-block keys, not DeepSpeed's


def declared_keys(block: str) -> set[str]:
    """The keys of a DeepSpeed block that the precision section declares as fields (``fp16.enabled`` ...)."""
    prefix = f"{block}."
    return {key[len(prefix):] for ref in FIELDS for key in ref.metadata["keys"] if key.startswith(prefix)}


def field_names(model) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return names


def test_key_lists_are_deepspeeds():
    pytest.importorskip("deepspeed")
    from deepspeed.comm.config import CommsLoggerConfig
    from deepspeed.monitor.config import CSVConfig, TensorBoardConfig, WandbConfig
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    assert declared_keys("fp16") - GPT_NEOX_FP16_KEYS == field_names(DeepSpeedFP16Config)
    assert declared_keys("bf16") == field_names(DeepSpeedBF16Config)
    assert set(keys.ZERO_KEYS) == field_names(DeepSpeedZeroConfig)
    assert set(keys.MONITOR_KEYS) == field_names(TensorBoardConfig) == field_names(CSVConfig)
    assert set(keys.WANDB_KEYS) == field_names(WandbConfig)
    assert set(keys.COMMS_LOGGER_KEYS) == field_names(CommsLoggerConfig)


def test_removed_blocks_are_the_ones_deepspeed_refuses():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_runtime_config

    removed = set(ds_runtime_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert set(keys.REMOVED_BLOCKS) | {"sparse_gradients"} <= removed


def test_fp16_flag_of_the_fork_loads_and_is_not_passed_on(write):
    ds = ds_of(write, "fp16: {fp16: true, enabled: true, loss_scale: 0, hysteresis: 2}\n")
    assert ds["fp16"]["enabled"] is True and "fp16" not in ds["fp16"] and "type" not in ds["fp16"]


def test_every_deepspeed_fp16_key_is_passed_on(write):
    ds = ds_of(write, "fp16: {enabled: true, auto_cast: true, consecutive_hysteresis: true, initial_scale_power: 12}\n")
    assert ds["fp16"]["auto_cast"] is True and ds["fp16"]["consecutive_hysteresis"] is True
    assert ds["fp16"]["initial_scale_power"] == 12


def test_bf16_keys_are_passed_on(write):
    ds = ds_of(write, "bf16: {enabled: true, check_grad_overflow: true, immediate_grad_update: true}\n"
                      "zero_optimization: {stage: 1}\n")
    assert ds["bf16"] == {"enabled": True, "immediate_grad_update": True}  # check_grad_overflow: DeepSpeed's default


def test_disabled_fp16_with_type_bfloat16_is_bf16_as_in_the_fork(write):
    ds = ds_of(write, "fp16: {enabled: false, type: bfloat16}\nzero_optimization: {stage: 1}\n")
    assert ds["bf16"] == {"enabled": True, "check_grad_overflow": False} and "fp16" not in ds


def test_zero_keys_are_checked_against_deepspeed(write):
    ds = ds_of(write, "zero_optimization: {stage: 1, stage3_max_live_parameters: 100, cpu_offload: false}\n")
    assert ds["zero_optimization"]["stage3_max_live_parameters"] == 100 and ds["zero_optimization"]["cpu_offload"] is False
    with pytest.raises(ConfigError) as info:
        load_config([write("z.yml", "zero_optimization: {stage: 1, overlap-com: true}\n")])
    assert "'zero_optimization.overlap-com'" in str(info.value) and "zero_optimization.overlap_comm" in str(info.value)
    with pytest.raises(ConfigError, match="mics_shard_size"):
        load_config([], {"zero_optimization.mics_shard_size": 2})


def test_other_blocks_pass_on_as_written(write):
    ds = ds_of(
        write,
        "scheduler: {type: WarmupLR, params: {warmup_num_steps: 10}}\n"
        "flops_profiler: {enabled: true, profile_step: 3}\n"
        "data_types: {grad_accum_dtype: fp32}\n"
        "comms_logger: {enabled: true, verbose: false}\n"
        "prescale_gradients: true\n"
        "communication_data_type: fp32\n"
        "deepspeed_extra_args: {dump_state: true, seq_parallel_communication_data_type: fp32}\n",
    )
    assert ds["scheduler"] == {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}
    assert ds["flops_profiler"] == {"enabled": True, "profile_step": 3}
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"} and ds["comms_logger"] == {"enabled": True, "verbose": False}
    assert ds["prescale_gradients"] is True and ds["communication_data_type"] == "fp32"
    assert ds["dump_state"] is True and ds["seq_parallel_communication_data_type"] == "fp32"
    assert "gradient_predivide_factor" not in ds_of(write, "")  # defaults are left to DeepSpeed


def test_monitor_keys_are_checked(write):
    with pytest.raises(ConfigError, match="tensorboard"):
        load_config([write("m.yml", "tensorboard: {enabled: true, path: tb}\n")])


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("amp: {enabled: true, opt_level: O1}\n", "Apex AMP"),
        ("elasticity: {enabled: true}\n", "elastic training"),
        ("curriculum_learning: {enabled: true}\n", "curriculum"),
        ("compression_training: {weight_quantization: {}}\n", "compression"),
        ("data_efficiency: {enabled: true}\n", "data efficiency"),
        ("deepspeed_extra_args: {train_batch_size: 64}\n", "train_batch_size"),
        ("deepspeed_extra_args: {amp: {enabled: false}}\n", "refuses"),
        ("prescale_gradients: true\ndeepspeed_extra_args: {prescale_gradients: false}\n", "also set at the top level"),
    ],
)
def test_what_deepspeed_or_kerple_cannot_take_is_refused_in_one_line(write, text, detail):
    path = write("r.yml", text)
    with pytest.raises(ConfigError) as info:
        load_config([path])
    assert path in str(info.value) and detail in str(info.value) and "\n" not in str(info.value)


def test_switched_off_removed_blocks_load_and_stay_out(write):
    text = "amp: {enabled: false}\nelasticity: {enabled: false}\nsparse_gradients: true\nsparse_attention: {mode: fixed}\n"
    ds = ds_of(write, text)
    assert not {"amp", "elasticity", "sparse_gradients", "sparse_attention"} & set(ds)
