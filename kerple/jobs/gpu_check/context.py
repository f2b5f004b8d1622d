"""What every step receives: the device, the sizes to run at, a scratch folder and a time budget.

Two scales. ``full`` is the check itself, sized for one H100 within the budgets below (whole check
under 20 minutes, each step under 10; nothing here has been timed on a GPU yet, so the budgets are
enforced rather than trusted: a step looks at :meth:`StepContext.out_of_time` between cases, records
the cases it had to leave out, and the runner kills a step that overruns its budget by more than
``KILL_GRACE_S``). ``tiny`` runs the same logic on a CPU in seconds (the harness's own test).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from kerple.jobs.gpu_check.report import StepResult
from kerple.jobs.process import REPO  # noqa: F401  (the steps' checkout)
KILL_GRACE_S = 30.0
EMBEDDINGS = ("none", "kerple_log", "kerple_power", "kerple_log3", "kerple_bias_wht", "alibi", "rpe", "rotary",
              "sandwich")


class Skip(Exception):
    """Raised by a step that cannot run here; the message is the reason shown in the report."""


@dataclass(frozen=True)
class Scale:
    """Sizes of every step. ``model`` is a model YAML, ``model_overrides`` are applied on top."""

    name: str
    model: str
    model_overrides: dict[str, Any]
    embeddings: tuple[str, ...]
    peak_size: int
    correctness_lengths: tuple[int, ...]
    correctness_dtypes: tuple[str, ...]
    throughput_seq: int
    throughput_micro_batch: int
    throughput_impls: tuple[str, ...]
    throughput_compile: tuple[bool, ...]
    throughput_steps: int
    throughput_warmup: int
    train_steps: int
    train_micro_batch: int
    train_seq: int
    train_documents: int
    train_vocab: int
    train_overrides: dict[str, Any]
    eval_model: str | None
    eval_lengths: tuple[int, ...]
    eval_impls: tuple[str, ...]
    eval_max_seconds: float
    budgets: dict[int, float] = field(default_factory=dict)
    throughput_embeddings: tuple[str, ...] | None = None  # step 4's embeddings (None: ``embeddings``)
    compile_embeddings: tuple[str, ...] | None = None  # measured with compile on (None: all of step 4's)
    table_variant: bool = True  # step 4 also measures flex gathering the distance table
    steps: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)  # the steps this scale runs by default (the profile: --profile)
    total_budget: float = 1080.0  # seconds for the whole check
    profile_embeddings: tuple[str, ...] = ("none", "kerple_log")  # step 8's embeddings
    profile_steps: int = 3  # step 8's profiled steps per case (after throughput_warmup and throughput_steps)

    def step_embeddings(self, step: int) -> tuple[str, ...]:
        """The embeddings step ``step`` measures."""
        return self.throughput_embeddings if step == 4 and self.throughput_embeddings else self.embeddings


# Budgets (seconds) on one H100; they sum to 1,100 s, the runner's whole-check budget is 1,080 s
# (start-up, wheel installation and kill grace fit in the remaining two minutes of 20). Step 2 runs
# about a hundred small FlexAttention tests, each compiling a forward and a backward kernel, on
# several pytest workers; step 3 compiles one pair per (embedding, length, precision).
FULL = Scale(
    name="full",
    model="configs/models/162M.yml",
    model_overrides={},
    embeddings=EMBEDDINGS,
    peak_size=8192,
    correctness_lengths=(512, 2048),
    correctness_dtypes=("fp32", "bf16"),
    throughput_seq=512,
    throughput_micro_batch=32,
    throughput_impls=("eager", "sdpa", "flex", "triton"),
    throughput_compile=(False, True),
    throughput_steps=10,
    throughput_warmup=3,
    train_steps=300,
    train_micro_batch=16,
    train_seq=512,
    train_documents=1000,
    train_vocab=8192,
    train_overrides={},
    eval_model="configs/models/162M.yml",
    eval_lengths=(2048, 8192, 16384, 32768, 65536),
    eval_impls=("flex", "sdpa", "eager"),  # the long-context path first
    eval_max_seconds=60.0,
    budgets={1: 20, 2: 300, 3: 210, 4: 240, 5: 150, 6: 60, 7: 120},
)

TINY = Scale(
    name="tiny",
    model="configs/models/tiny.yml",
    model_overrides={"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 96,
                     "make_vocab_size_divisible_by": 8, "max_position_embeddings": 64},
    embeddings=("none", "kerple_log"),
    peak_size=128,
    correctness_lengths=(48,),
    correctness_dtypes=("fp32",),
    throughput_seq=32,
    throughput_micro_batch=2,
    throughput_impls=("eager", "sdpa", "flex", "triton"),
    throughput_compile=(False, True),
    throughput_steps=2,
    throughput_warmup=1,
    train_steps=10,
    train_micro_batch=4,
    train_seq=32,
    train_documents=12,
    train_vocab=300,
    train_overrides={"lr": 0.01, "warmup": 0.0},
    eval_model=None,
    eval_lengths=(128,),
    eval_impls=("sdpa",),
    eval_max_seconds=30.0,
    budgets={1: 30, 2: 30, 3: 60, 4: 120, 5: 120, 6: 30, 7: 60},
    total_budget=600.0,
)

# ``--quick``: what one short GPU lease must prove, the most valuable first, in at most 540 s (a lease
# is 15 minutes of device time, machine start included, and 600 s per command). Step 3 in bf16 at the
# 162M shape (the positional gradients through compiled FlexAttention), then
# step 4 for the embeddings of the throughput targets, without compile first, then ``none`` and
# ``kerple_log`` compiled.
QUICK_EMBEDDINGS = ("none", "kerple_log", "alibi", "rpe", "kerple_bias_wht")
QUICK = replace(
    FULL, name="quick", embeddings=QUICK_EMBEDDINGS, correctness_lengths=(512,), correctness_dtypes=("bf16",),
    throughput_embeddings=("none", "kerple_log", "alibi", "rpe"), throughput_impls=("sdpa", "flex"),
    compile_embeddings=("none", "kerple_log"), table_variant=False, throughput_steps=8, throughput_warmup=3,
    steps=(1, 3, 4), total_budget=540.0, budgets={1: 15, 3: 150, 4: 360},
)
# the same choices at the tiny sizes, for the CPU test of ``--quick``
TINY_QUICK = replace(
    TINY, name="tiny-quick", embeddings=QUICK_EMBEDDINGS, throughput_embeddings=("none", "kerple_log", "alibi", "rpe"),
    throughput_impls=("sdpa", "flex"), compile_embeddings=("none", "kerple_log"), table_variant=False,
    steps=(1, 3, 4), total_budget=300.0,
)
# ``--profile``: step 8 alone, in at most 150 s (about 20 s per uncompiled case on one H100 is the
# plan; compiled cases come after both uncompiled ones and are left out when the budget runs short)
PROFILE = replace(FULL, name="profile", steps=(8,), total_budget=150.0, budgets={8: 140},
                  throughput_warmup=3, throughput_steps=5, profile_steps=3)
TINY_PROFILE = replace(TINY, name="tiny-profile", steps=(8,), total_budget=120.0, budgets={8: 110},
                       throughput_warmup=1, throughput_steps=2, profile_steps=1)
SCALES = {"full": FULL, "tiny": TINY, "quick": QUICK, "tiny-quick": TINY_QUICK, "profile": PROFILE,
          "tiny-profile": TINY_PROFILE}


@dataclass
class StepContext:
    """One step's surroundings. ``save`` persists ``result`` (called by :meth:`progress` after each
    case, so a step killed for time still reports what it finished)."""

    device: torch.device
    scale: Scale
    work: Path
    result: StepResult
    deadline: float
    save: Callable[[StepResult], None] = lambda result: None

    def remaining(self) -> float:
        """Seconds left of this step's budget."""
        return self.deadline - time.monotonic()

    def out_of_time(self) -> bool:
        return self.remaining() <= 0

    def progress(self, message: str) -> None:
        """Print a progress line and persist the partial result."""
        print(f"[step {self.result.number}] {message}", flush=True)
        self.save(self.result)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def require_cuda(self, why: str) -> None:
        """Skip this step without CUDA (``why``: what needs it)."""
        if not self.cuda:
            raise Skip(f"needs a CUDA GPU: {why}")


def model_config(scale: Scale, pos_emb: str, **overrides: Any) -> Any:
    """The :class:`kerple.config.Config` of ``scale.model`` with ``pos_emb`` and ``overrides``."""
    from kerple.config import load_config

    return load_config([str(REPO / scale.model)], {**scale.model_overrides, "pos_emb": pos_emb, **overrides})


def allow_recompiles(limit: int = 64) -> None:
    """Raise TorchDynamo's per-function recompile limit (8 by default; ``cache_size_limit`` in older
    releases). One process here compiles the same layer for many embeddings and kernels; past the
    limit Dynamo would silently run the rest uncompiled and the timings would lie."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))
