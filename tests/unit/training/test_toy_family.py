"""A new model family costs one file and one registry line: ``toy_family.py`` here, and the line
this test adds to ``kerple.model.families``. Everything else (config checks, training, checkpoints,
loading a run, conversion) must follow from the family's declared capabilities."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import toy_family
from kerple import checkpoint as ckpt
from kerple.checkpoint.convert import main as convert_main
from kerple.config import ConfigError
from kerple.model import families
from kerple.runs import load_run
from tiny_run import corpus, parallel, tiny_config, train  # noqa: F401 (fixtures)

TOY = {"arch": "causalmean", "pos_emb": "none", "attention_impl": "eager"}


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one registry line of the new family."""
    monkeypatch.setitem(families._FAMILIES, toy_family.FAMILY.name, toy_family.FAMILY)


def test_config_checks_follow_the_capabilities(registered: None, corpus: Path) -> None:
    assert isinstance(families.build_model(tiny_config(corpus, **TOY)), toy_family.CausalMeanModel)
    for key, value in (("pos_emb", "alibi"), ("attention_impl", "sdpa"), ("attention_window", 8),
                       ("model_parallel_size", 2), ("pipe_parallel_size", 2)):
        with pytest.raises(ConfigError, match=f"key '{key}': arch='causalmean'"):
            tiny_config(corpus, **{**TOY, key: value})


def test_it_trains_saves_loads_and_refuses_export(registered: None, parallel, corpus: Path, tmp_path: Path) -> None:
    save = tmp_path / "run"
    result = train(tiny_config(corpus, train_iters=3, lr_decay_iters=3, save=str(save), save_interval=3, **TOY), parallel)
    assert len(result.losses) == 3
    meta = ckpt.safe_torch_load(save / "global_step3" / "mp_rank_00_model_states.pt")
    assert meta["args"]["arch"] == "causalmean"  # the family's recorded arguments

    cfg = tiny_config(corpus, **TOY)
    run = load_run(cfg, str(save), quiet=True)
    tokens = torch.randint(0, 63, (2, 16))
    with torch.no_grad():
        assert torch.isfinite(run.model.chunked_loss(tokens[:, :-1], tokens[:, 1:])).all()
    gpt = tiny_config(corpus)
    with pytest.raises(ckpt.ArchitectureMismatchError, match="arch: checkpoint 'causalmean' vs config 'gpt'"):
        load_run(gpt, str(save), quiet=True)
    assert convert_main([str(save), str(tmp_path / "neox"), "--to", "neox"]) == 2
    assert not (tmp_path / "neox").exists()
