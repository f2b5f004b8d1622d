"""What a reproduction runs: the two scales, the token budget in steps, and each run's config arguments.

``full`` is the paper's set-up (KERPLE §5.1, Table 2; ``configs/models/162M.yml``): 12 layers,
hidden 768, 12 heads, train length 512, batch 32 x 512, Adam at lr 6e-4 with cosine decay and 1%
warm-up, bf16, gradient clipping 1.0; the paper trains 50,000 steps (819M tokens), here the stated
budget sets the steps and the schedule spans them. The tokenizer is a byte-level BPE of 50,257 ids
(GPT-2's size, padded to 50,304 as in the paper) trained on the corpus's train split, so the model
has the paper's 162M parameters. ``tiny`` runs the same orchestration on a CPU in seconds (a
2-layer model on a few thousand tokens, scored on 4,096 tokens per length): its numbers mean
nothing, its files and steps are real.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerple.data.prepared import PreparedData
from kerple.reproduce.errors import ReproduceError

REPO = Path(__file__).resolve().parents[2]
PAPER_STEPS = 50_000  # KERPLE Table 2
FACTORS = (1, 2, 4, 8, 16, 32)  # Table 3: 512 .. 16384 at train length 512
DEFAULT_POS_EMBS = ("kerple_log", "alibi", "rotary", "none")
SOURCE = "python"  # prepare_data.py's source of the Python files on this machine


@dataclass(frozen=True)
class Scale:
    """Sizes and cadences of one scale (see the module docstring)."""

    name: str
    model_files: tuple[str, ...]
    model_overrides: dict[str, Any]
    seq_length: int
    micro_batch: int
    vocab: int
    split: str
    default_tokens: int
    save_interval: int
    log_interval: int
    stop_margin_s: float  # time a trainer asked to stop needs for its last step, a checkpoint and its exit
    report_s: float  # time kept at the end of a chunk for writing the report
    min_train_s: float  # a training chunk starts only with this long before it would be asked to stop
    file_limit: int | None = None  # documents taken from the machine's own folders (tiny: a slice)
    eval_token_cap: int | None = None  # scored tokens per length at most (None: the whole validation split)
    needs_cuda: bool = False
    tensorboard: bool = False

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.seq_length

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(self.seq_length * factor for factor in FACTORS)


FULL = Scale(
    name="full", model_files=("configs/models/162M.yml",), model_overrides={}, seq_length=512, micro_batch=32,
    vocab=50_257, split="949,50,1", default_tokens=600_000_000, save_interval=2000, log_interval=100,
    stop_margin_s=60.0, report_s=20.0, min_train_s=120.0, eval_token_cap=4_194_304, needs_cuda=True, tensorboard=True,
)
TINY = Scale(
    name="tiny", model_files=("configs/models/tiny.yml", "configs/setups/cpu.yml"),
    model_overrides={"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "lr": 0.003, "eval_iters": 1},
    seq_length=16, micro_batch=8, vocab=320, split="90,10,0", default_tokens=60 * 128, save_interval=10,
    log_interval=5, stop_margin_s=10.0, report_s=2.0, min_train_s=5.0, file_limit=60, eval_token_cap=4096,
)
SCALES = {scale.name: scale for scale in (FULL, TINY)}


@dataclass(frozen=True)
class Settings:
    """One reproduction: the scale, the budget, the embeddings and where everything goes."""

    scale: Scale
    tokens: int
    pos_embs: tuple[str, ...]
    work: Path
    roots: tuple[str, ...] = ()
    seed: int = 1234
    attention_impl: str = "auto"
    corpus_tokens: int | None = None  # the lease preset's cap on the corpus (None: the whole corpus)

    @property
    def steps(self) -> int:
        """Optimizer steps of the budget (rounded up to whole steps)."""
        return math.ceil(self.tokens / self.scale.tokens_per_step)

    def fingerprint(self) -> dict[str, Any]:
        """What every chunk of one reproduction must share (a change would mix two experiments)."""
        scale = self.scale
        fingerprint = {"scale": scale.name, "steps": self.steps, "tokens_per_step": scale.tokens_per_step,
                       "seed": self.seed, "vocab": scale.vocab, "split": scale.split, "roots": list(self.roots),
                       "lengths": list(scale.lengths)}
        return fingerprint if self.corpus_tokens is None else {**fingerprint, "corpus_tokens": self.corpus_tokens}


def parse_tokens(text: str, flag: str = "--tokens") -> int:
    """``600M``, ``1.5B``, ``250k`` or ``8192`` -> a positive token count (errors name ``flag``)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbB]?)\s*", text)
    if not match:
        raise ReproduceError(f"{flag} {text!r}: expected a count such as 600M, 1.5B, 250k or 8192")
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9}[match.group(2).lower()]
    if value < 1:
        raise ReproduceError(f"{flag} {text!r}: give at least one token")
    return int(round(value))


def check_pos_embs(names: list[str]) -> tuple[str, ...]:
    """The embeddings to run, each with its ``configs/pe/<name>.yml``; duplicates refused."""
    available = sorted(path.stem for path in (REPO / "configs" / "pe").glob("*.yml"))
    for name in names:
        if name not in available:
            raise ReproduceError(f"--pos-emb {name!r}: no configs/pe/{name}.yml; choose from {', '.join(available)}")
    if len(set(names)) != len(names) or not names:
        raise ReproduceError(f"--pos-emb {','.join(names)!r}: name each embedding once")
    return tuple(names)


def run_folder(settings: Settings, pos_emb: str) -> Path:
    return settings.work / "runs" / pos_emb


def config_arguments(settings: Settings, corpus: PreparedData, pos_emb: str, attention_impl: str) -> list[str]:
    """YAML files and ``key=value`` overrides shared by ``train.py`` and ``evaluate.py`` for one run."""
    scale, folder = settings.scale, run_folder(settings, pos_emb)
    overrides: dict[str, Any] = {
        **scale.model_overrides, **corpus.config_overrides(),
        "seq_length": scale.seq_length, "max_position_embeddings": scale.seq_length,
        "train_micro_batch_size_per_gpu": scale.micro_batch, "gradient_accumulation_steps": 1,
        "train_iters": settings.steps, "lr_decay_iters": settings.steps, "seed": settings.seed,
        "save": folder / "checkpoints", "load": folder / "checkpoints", "save_interval": scale.save_interval,
        "keep_last_n_checkpoints": 1, "log_interval": scale.log_interval, "log_dir": folder / "logs",
        "tensorboard_dir": folder / "logs" / "tensorboard" if scale.tensorboard else "", "use_wandb": "false",
        "attention_impl": attention_impl,
    }
    files = [str(REPO / name) for name in (*scale.model_files, f"configs/pe/{pos_emb}.yml")]
    return files + [f"{key}={value}" for key, value in overrides.items()]
