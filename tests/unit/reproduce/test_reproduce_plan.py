"""The reproduction's plan: the budget in steps, the paper's 162M recipe reaching the config, the state file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kerple.config import load_config, parse_overrides, split_arguments
from kerple.data.prepared import PreparedData
from kerple.model import build_model
from kerple.reproduce.errors import ReproduceError
from kerple.reproduce.plan import FULL, TINY, Settings, check_pos_embs, config_arguments, parse_tokens
from kerple.reproduce.state import Chunk, State


@pytest.mark.parametrize("text, count", [("600M", 600_000_000), ("1.5B", 1_500_000_000), ("250k", 250_000),
                                         ("8192", 8192), (" 0.5m ", 500_000)])
def test_token_counts(text: str, count: int) -> None:
    assert parse_tokens(text) == count


@pytest.mark.parametrize("text", ["12x", "", "M", "0", "-5M"])
def test_bad_token_counts_are_refused(text: str) -> None:
    with pytest.raises(ReproduceError, match="--tokens"):
        parse_tokens(text)


def test_budget_in_steps_of_the_papers_batch() -> None:
    # Table 2: batch 32 x 512 = 16,384 tokens per step; the paper's 50,000 steps are 819,200,000 tokens
    assert Settings(FULL, 819_200_000, ("kerple_log",), Path("w")).steps == 50_000
    assert Settings(FULL, 600_000_000, ("kerple_log",), Path("w")).steps == 36_622  # 36,621.09 rounded up
    assert FULL.lengths == (512, 1024, 2048, 4096, 8192, 16384) and TINY.lengths[-1] == 32 * TINY.seq_length


def test_embeddings_must_have_a_config() -> None:
    assert check_pos_embs(["kerple_log", "none"]) == ("kerple_log", "none")
    with pytest.raises(ReproduceError, match="no configs/pe/kerple_logg.yml"):
        check_pos_embs(["kerple_logg"])
    with pytest.raises(ReproduceError, match="name each embedding once"):
        check_pos_embs(["alibi", "alibi"])


@pytest.mark.parametrize("pos_emb, parameters", [("none", 162_322_944), ("kerple_log", 162_322_968)])
def test_the_full_scale_config_is_the_papers_162m_model(pos_emb: str, parameters: int) -> None:
    """Table 2 reaches the model: 12 layers, hidden 768, 12 heads, Adam lr 6e-4, bf16, batch 32 x 512.
    Parameters by hand: untied embedding and head 2 x 50,304 x 768 = 77,266,944; per layer qkv 1,771,776
    + dense 590,592 + MLP 2,362,368 + 2,360,064 + two layer norms 3,072 = 7,087,872, x 12 = 85,054,464;
    final layer norm 1,536: 162,322,944; KERPLE-log adds r1, r2 per head (24)."""
    settings = Settings(FULL, 100_000_000, (pos_emb,), Path("/tmp/work"))
    corpus = PreparedData("/data/python_text_document", "949,50,1", "/data/bpe.json", 50_257, {}, {})
    yamls, overrides = split_arguments(config_arguments(settings, corpus, pos_emb, "sdpa"))
    cfg = load_config(yamls, parse_overrides(overrides))
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads) == (12, 768, 12)
    assert (cfg.training.micro_batch_size, cfg.model.seq_length, cfg.precision.precision) == (32, 512, "bf16")
    assert cfg.optimizer.lr == 6e-4 and cfg.lr_schedule.lr_decay_style == "cosine" and cfg.lr_schedule.warmup == 0.01
    assert cfg.training.train_iters == cfg.lr_schedule.lr_decay_iters == settings.steps == 6104
    assert cfg.checkpointing.save == cfg.checkpointing.load == str(Path("/tmp/work/runs") / pos_emb / "checkpoints")
    assert cfg.attention.attention_impl == "sdpa" and cfg.positional.pos_emb == pos_emb
    with torch.device("meta"):
        model = build_model(cfg, flex_compile=False)
    assert sum(p.numel() for p in model.parameters()) == parameters


def test_state_round_trip_and_refusal_of_other_settings(tmp_path: Path) -> None:
    settings = Settings(TINY, 7680, ("kerple_log",), tmp_path)
    state = State.load(tmp_path / "state.json", settings.fingerprint())
    state.run("kerple_log").chunks.append(Chunk("train", 12.5, 0, 30, "auto", "stopped"))
    state.save()
    again = State.load(tmp_path / "state.json", settings.fingerprint())
    assert again.runs["kerple_log"].chunks[0].end_step == 30 and again.runs["kerple_log"].seconds("train") == 12.5
    other = Settings(TINY, 2 * 7680, ("kerple_log",), tmp_path)
    with pytest.raises(ReproduceError, match=r"other settings \(steps 60 -> 120\)"):
        State.load(tmp_path / "state.json", other.fingerprint())
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(ReproduceError, match="not a reproduction state file"):
        State.load(tmp_path / "state.json", settings.fingerprint())


def test_a_flex_failure_moves_later_chunks_to_sdpa() -> None:
    record = State(Path("s.json"), {}).run("alibi")
    assert record.impl("train", "auto") == "auto" and record.impl("evaluate", "flex") == "flex"
    record.fallback = "InductorError: No valid triton configs"
    assert record.impl("train", "auto") == "sdpa" and record.impl("evaluate", "auto") == "sdpa"
    assert record.impl("train", "eager") == "eager"
