"""The ranks' stop vote (kerple.parallel.vote): every rank stops at the same step, ``lag`` steps after
any rank raised its flag, and with one rank the flag is the answer at once."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "training"))

from kerple.parallel.vote import LaggedVote  # noqa: E402
from tiny_run import run_two_ranks  # noqa: E402

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from kerple.parallel.vote import LaggedVote

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    answers = {}
    for lag in (1, 2, 3):
        vote = LaggedVote(2, torch.device("cpu"), lag=lag)
        # rank 1 raises its flag at step 3 and keeps it raised, as a received signal stays recorded
        answers[lag] = [vote(rank == 1 and step >= 3) for step in range(10)]
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
        json.dump(answers, out)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_every_rank_stops_at_the_same_step_lag_steps_after_the_flag(tmp_path: Path) -> None:
    script = tmp_path / "vote.py"
    script.write_text(SCRIPT.replace("sys.argv[1]", repr(str(tmp_path))))
    run_two_ranks(script, timeout=300)
    import json

    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1]  # rank 0 never raised a flag and still stops with rank 1
    for lag, answers in ranks[0].items():
        first = answers.index(True)
        assert first == 3 + int(lag), (lag, answers)
        assert all(answers[first:]), (lag, answers)


def test_one_rank_answers_at_once() -> None:
    vote = LaggedVote(1, torch.device("cpu"))
    assert [vote(step >= 2) for step in range(4)] == [False, False, True, True]
    with pytest.raises(ValueError, match="lag 0"):
        LaggedVote(2, torch.device("cpu"), lag=0)
