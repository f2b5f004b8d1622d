"""``tools/generate_ymls.py``'s named grids: the thesis' Table 4.1 runs and the later methods beside
KERPLE, each loading with its setting."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kerple.config import load_config

REPO = Path(__file__).resolve().parents[3]


def load_tool():  # noqa: ANN201 - the tool's module
    spec = importlib.util.spec_from_file_location("generate_ymls", REPO / "tools" / "generate_ymls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_4_1_grid_configs_load_with_their_settings(tmp_path: Path) -> None:
    tool = load_tool()
    assert tool.main(["--grid", "table4.1", "--data", "arxiv", "--out", str(tmp_path)]) == 0
    commands = (tmp_path / "run_all.sh").read_text().splitlines()[2:]
    assert len(commands) == 6 + 5 + 6
    seen = {"shift": set(), "same": set(), "window": set()}
    for command in commands:
        files = [str(REPO / f) if not f.startswith("/") else f for f in command.split()[3:]]
        cfg = load_config(files)
        assert cfg.model.seq_length == 512 and cfg.training.seed == 1235
        if "window" in files[-1]:
            assert cfg.positional.pos_emb == "none"
            seen["window"].add(cfg.attention.attention_window)
        else:
            assert cfg.positional.pos_emb == "alibi"
            options = cfg.positional.options()
            if "same-h" in files[-1]:
                seen["same"].add(options["alibi_equal_slope"])
            else:
                seen["shift"].add(options["alibi_slope_shift"])
    assert seen["shift"] == {-3, 0, 2, 4, 6, 8}
    assert seen["same"] == {0, 2, 4, 6, 8}
    assert seen["window"] == {40, 80, 100, 120, 160, 320}


def test_beyond_kerple_grid_loads_every_later_method_beside_its_baselines(tmp_path: Path) -> None:
    tool = load_tool()
    assert tool.main(["--grid", "beyond", "--data", "github", "--seeds", "1235", "--out", str(tmp_path)]) == 0
    commands = (tmp_path / "run_all.sh").read_text().splitlines()[2:]
    seen = set()
    for command in commands:
        files = [str(REPO / f) if not f.startswith("/") else f for f in command.split()[3:]]
        cfg = load_config(files)
        seen.add((cfg.positional.pos_emb, cfg.model.seq_length))
        assert cfg.training.seed == 1235 and cfg.model.num_layers == 12
    assert seen == {(pe, length) for pe in ("kerple_log", "alibi", "fire", "cable", "xpos") for length in (512, 1024)}


def test_extension_grid_fine_tunes_each_base_run_at_four_times_its_length(tmp_path: Path) -> None:
    tool = load_tool()
    assert tool.main(["--grid", "extension", "--data", "github", "--seeds", "1235", "--lengths", "512",
                      "--out", str(tmp_path)]) == 0
    commands = (tmp_path / "run_all.sh").read_text().splitlines()[2:]
    bases, finetunes = {}, {}
    for command in commands:
        files = [str(REPO / f) if not f.startswith("/") else f for f in command.split()[3:]]
        cfg = load_config(files)
        rope_type = (cfg.positional.rope_scaling or {}).get("rope_type")
        if cfg.checkpointing.finetune:
            assert cfg.checkpointing.load in bases.values(), "a fine-tuning runs after the run it starts from"
            assert cfg.model.seq_length == 2048 and cfg.training.train_iters == 400
            assert cfg.training.micro_batch_size * cfg.model.seq_length == 32 * 512  # the same tokens per step
            finetunes[(cfg.positional.pos_emb, rope_type)] = cfg.positional.rope_scaling
        else:
            assert cfg.model.seq_length == 512 and cfg.model.num_layers == 12
            bases[cfg.positional.pos_emb] = cfg.checkpointing.save
    assert set(bases) == {"rotary", "kerple_log", "alibi"}
    assert set(finetunes) == {("rotary", "linear"), ("rotary", "yarn"), ("rotary", None), ("kerple_log", None),
                              ("alibi", None)}
    assert finetunes[("rotary", "yarn")] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}


def test_pe_with_a_named_grid_is_refused_not_ignored(tmp_path: Path, capsys) -> None:
    """A grid names its own embeddings; --pe beside it was ignored without a word."""
    for grid in ("extension", "beyond", "table4.1"):
        assert load_tool().main(["--grid", grid, "--pe", "alibi", "--out", str(tmp_path)]) == 2
        assert f"--pe with --grid {grid}: the grid names its own embeddings" in capsys.readouterr().err
    assert load_tool().main(["--pe", "alibi", "alibi", "--out", str(tmp_path)]) == 2
    assert "--pe: alibi is named twice" in capsys.readouterr().err
    assert load_tool().main(["--pe", "alibi", "--lengths", "512", "512", "--out", str(tmp_path)]) == 2
    assert "--lengths: 512 is named twice" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
