"""The on-disk format does not change: files written by an earlier kerple are rewritten identically.

``tests/fixtures/checkpoints`` holds checkpoints written by the trainer's and the converter's
writers of the commit that added them (``make_fixtures.py`` there). For the same weights, today's
writers must produce the same files: every layer file with the same keys and tensors, every
``mp_rank`` record with the same keys and values (``args`` included; ``args.positional_options``
may also hold options declared since, at their defaults, which is what a record without them
means, and ``args`` the run-time options recorded since, at the fixtures' runs' values). And the old files must load into today's model with the same logits, bit for bit.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kerple import positional
from kerple.checkpoint import (
    NeoxAdapter,
    RunState,
    architecture_args,
    capture_rng,
    load_model_weights,
    safe_torch_load,
    save_checkpoint,
    write_checkpoint,
)
from kerple.config import load_config
from kerple.model import build_model
from kerple.parallel.groups import ParallelState

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
ADDED_ARGS = {"attention_window": None}
"""``args`` keys a record holds since the fixtures were written, with the fixtures' runs' values."""
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES: dict[str, dict[str, Any]] = MANIFEST["cases"]
TRAINER = sorted(name for name, case in CASES.items() if case["writer"] == "trainer")
CONVERTER = sorted(name for name, case in CASES.items() if case["writer"] == "converter")


def _config(case: dict[str, Any]) -> Any:
    # the fixtures were written when lr_decay_style defaulted to cosine; GPT-NeoX's default is linear
    return load_config(
        [], {**MANIFEST["model"], "lr_decay_style": "cosine", "pos_emb": case["pos_emb"], "no_weight_tying": case["untied"]}
    )


def _loaded_model(name: str) -> tuple[torch.nn.Module, Any]:
    """A fresh model of the case's config with the fixture's weights loaded."""
    case = CASES[name]
    cfg = _config(case)
    torch.manual_seed(12345)  # other weights than the fixture's, so the load must overwrite them all
    model = build_model(cfg, flex_compile=False)
    assert load_model_weights(model, FIXTURES / name, cfg=cfg) == case["iteration"]
    return model.eval(), cfg


def _tag(root: Path, name: str) -> Path:
    return root / name / f"global_step{CASES[name]['iteration']}"


def _assert_same(ours: Any, theirs: Any, where: str) -> None:
    """Deep equality: tensors by dtype, shape and value; dicts by key set; everything else by ==."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), where
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), where
        assert torch.equal(ours, theirs), where
    elif isinstance(theirs, dict):
        if where.endswith("['positional_options']"):  # options added since the fixture: at their defaults
            defaults = {spec.name: spec.default for spec in positional.option_specs()}
            added = {key: value for key, value in ours.items() if key not in theirs}
            assert added == {key: defaults.get(key, object()) for key in added}, (where, added)
            ours = {key: value for key, value in ours.items() if key in theirs}
        if where.endswith("['args']"):  # run-time options recorded since the fixture: those of its run
            added = {key: value for key, value in ours.items() if key not in theirs}
            assert added == {key: ADDED_ARGS.get(key, object()) for key in added}, (where, added)
            ours = {key: value for key, value in ours.items() if key in theirs}
        assert isinstance(ours, dict) and set(ours) == set(theirs), (where, sorted(map(str, ours)), sorted(map(str, theirs)))
        for key in theirs:
            _assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), where
        for index, (mine, other) in enumerate(zip(ours, theirs)):
            _assert_same(mine, other, f"{where}[{index}]")
    else:
        assert type(ours) is type(theirs) and ours == theirs, (where, ours, theirs)


def _assert_same_files(ours: Path, theirs: Path) -> None:
    """Both tag directories hold the same files; each ``.pt`` the same objects, the rest the same text."""
    files = sorted(p.relative_to(theirs) for p in theirs.rglob("*") if p.is_file())
    assert sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file()) == files
    for relative in files:
        if relative.suffix == ".pt":
            _assert_same(safe_torch_load(ours / relative), safe_torch_load(theirs / relative), str(relative))
        else:
            assert (ours / relative).read_text() == (theirs / relative).read_text(), relative


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_loads_with_the_same_logits(name: str) -> None:
    model, _ = _loaded_model(name)
    stored = torch.load(FIXTURES / "logits.pt", weights_only=True)
    with torch.no_grad():
        logits = model(stored["tokens"])
    # float32 rounding differs between CPUs (the stored logits, written on an AVX-512 machine, differ by up
    # to 9e-8 on an AVX2 one); a weight loaded wrong moves logits by orders of magnitude more
    torch.testing.assert_close(logits, stored["logits"][name], rtol=1e-5, atol=1e-6)


def _optimizer_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The checkpoint names of the optimizer's parameters (a shared one by its first copy), group by group."""
    adapter = NeoxAdapter.for_model(model)
    first_copy: dict[str, str] = {}
    for reference, internal in adapter.to_reference({name: name for name, _ in model.named_parameters()}).items():
        first_copy.setdefault(internal, reference)
    names = {id(param): first_copy[key] for key, param in model.named_parameters()}
    return [[names[id(param)] for param in group["params"]] for group in optimizer.param_groups]


@pytest.mark.parametrize("name", TRAINER)
def test_trainer_writer_rewrites_the_fixture(name: str, tmp_path: Path) -> None:
    from kerple.training.optimizer import build_optimizer
    from kerple.training.schedule import AnnealingLR

    case = CASES[name]
    model, cfg = _loaded_model(name)
    record = safe_torch_load(_tag(FIXTURES, name) / "mp_rank_00_model_states.pt")
    optimizer = build_optimizer(model, cfg.optimizer)
    # the saved optimizer state refers to parameters by position: the order must not change
    assert _optimizer_names(model, optimizer) == case["optimizer_order"]
    if case["optimizer"]:
        optimizer.load_state_dict(record["optimizer"])
    scheduler = AnnealingLR(optimizer, lr=cfg.optimizer.lr, warmup=cfg.lr_schedule.warmup, decay_iters=10,
                            style=cfg.lr_schedule.lr_decay_style, min_lr=cfg.lr_schedule.min_lr)
    scheduler.load_state_dict(record["lr_scheduler"])
    rng = {}
    if case["rng"]:
        random.seed(case["rng_seed"])
        np.random.seed(case["rng_seed"])
        torch.manual_seed(case["rng_seed"])
        rng = capture_rng()
    run_state = RunState(
        iteration=case["iteration"],
        args=architecture_args(cfg),
        consumed_train_samples=record["consumed_train_samples"],
        skipped_steps=record["skipped_steps"],
        seed=int(cfg.training.seed),
        lr_scheduler=scheduler.state_dict(),
        rng=rng,
        ds_version=record["ds_version"],
    )
    one_process = ParallelState(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    save_checkpoint(tmp_path / name, module=model, run_state=run_state, optimizer=optimizer if case["optimizer"] else None,
                    parallel=one_process)
    _assert_same_files(_tag(tmp_path, name), _tag(FIXTURES, name))
    assert (tmp_path / name / "latest").read_text() == (FIXTURES / name / "latest").read_text()


@pytest.mark.parametrize("name", CONVERTER)
def test_converter_writer_rewrites_the_fixture(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    model, cfg = _loaded_model(name)
    ranks = case["model_parallel_size"]
    state = NeoxAdapter.for_model(model).to_reference(model.state_dict())
    write_checkpoint(
        tmp_path / name, state, iteration=case["iteration"], args=architecture_args(cfg),
        layout=case["layout"], model_parallel_size=ranks, flavor=case["flavor"],
        config_files={"model.yml": f"pos-emb: {case['pos_emb']}\n"}, output_layer_parallelism=case["output_layer_parallelism"],
    )
    _assert_same_files(_tag(tmp_path, name), _tag(FIXTURES, name))
    assert (tmp_path / name / "latest").read_text() == (FIXTURES / name / "latest").read_text()
