"""Parallel layouts the trainer cannot run are refused when a training run fixes its layout
(``Config.resolve_batch``), naming keys and files; such a config still loads to describe a model."""

from __future__ import annotations

import pytest

from kerple.config import ConfigError, load_config


def refused(paths: list[str]) -> str:
    cfg = load_config(paths)  # describing the model is fine: evaluation and conversion need no layout
    with pytest.raises(ConfigError) as info:
        cfg.resolve_batch(64)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "keys", "detail"),
    [
        ("pipe-parallel-size: 2\nmodel-parallel-size: 2\n", "'pipe-parallel-size' and 'model-parallel-size'",
         "tensor and pipeline parallelism together"),
        ("pipe-parallel-size: 2\nzero_optimization: {stage: 2}\n", "'pipe-parallel-size' and 'zero_optimization.stage'",
         "ZeRO stage 0 or 1 only"),
        ("pipe-parallel-size: 4\nzero_optimization: {stage: 3}\n", "'pipe-parallel-size' and 'zero_optimization.stage'",
         "zero_optimization.stage=3"),
        ("pipe-parallel-size: 2\nno-weight-tying: false\n", "'pipe-parallel-size' and 'no-weight-tying'",
         "untied LM head"),
        ("pipe-parallel-size: 3\nnum-layers: 2\n", "'num-layers' and 'pipe-parallel-size'",
         "every pipeline stage needs at least one transformer layer"),
        ("model-parallel-size: 2\nzero_optimization: {stage: 1}\n", "'model-parallel-size' and 'zero_optimization.stage'",
         "ZeRO stage 0 only"),
    ],
)
def test_unsupported_combination_is_refused_at_load(write, text: str, keys: str, detail: str) -> None:
    untied = "" if "no-weight-tying" in text else "no-weight-tying: true\n"  # GPT-NeoX's default ties the head
    path = write("parallel.yml", text + untied)
    message = refused([path])
    assert message.startswith(f"{path}: keys {keys}: ") and detail in message


def test_keys_from_two_files_name_both(write) -> None:
    model = write("model.yml", "num-layers: 2\nno-weight-tying: true\n")
    setup = write("setup.yml", "pipe-parallel-size: 4\n")
    assert refused([model, setup]).startswith(f"{model}, {setup}: keys 'num-layers' and 'pipe-parallel-size'")


def test_a_key_left_at_its_default_is_named_too(write) -> None:
    path = write("pipe.yml", "pipe-parallel-size: 16\nno-weight-tying: true\n")  # the default num_layers is 12
    assert refused([path]).startswith(f"<default>, {path}: keys 'num_layers' and 'pipe-parallel-size'")


@pytest.mark.parametrize(
    "text",
    [
        "pipe-parallel-size: 2\nnum-layers: 2\nzero_optimization: {stage: 1}\n",  # pipeline with ZeRO 1
        "pipe-parallel-size: 1\nmodel-parallel-size: 2\nno-weight-tying: false\n",  # one stage: TP and a tied head
        "model-parallel-size: 2\nzero_optimization: {stage: 0}\n",  # the paper's 1.3B layout
        "zero_optimization: {stage: 3}\n",  # ZeRO-3 without pipeline or tensor parallelism
    ],
)
def test_supported_layouts_load(write, text: str) -> None:
    untied = "" if "no-weight-tying" in text else "no-weight-tying: true\n"
    load_config([write("ok.yml", text + untied + "train_micro_batch_size_per_gpu: 1\n")]).resolve_batch(4)
