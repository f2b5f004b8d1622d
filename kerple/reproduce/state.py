"""What the earlier chunks of one reproduction did: ``<work>/state.json``, rewritten atomically.

Checkpoints and results files say *where* a reproduction stands; the state adds what they cannot:
the settings every chunk must share, the wall time of every child process (for the report's
timings), the attention kernel each run ended up with (FlexAttention, or ``sdpa`` after a
FlexAttention failure, with the reason), and for the lease preset the plan its steps were sized by.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kerple.atomic import write_json_atomic
from kerple.reproduce.errors import ReproduceError

FORMAT = "kerple-reproduce-1"


@dataclass
class Chunk:
    """One child process of a run: ``train`` (steps ``start_step`` to ``end_step``) or ``evaluate``."""

    kind: str
    seconds: float
    start_step: int
    end_step: int
    attention_impl: str
    status: str  # finished | stopped | failed


@dataclass
class RunRecord:
    """One embedding's run: its chunks, and why FlexAttention was given up (training, evaluation)."""

    chunks: list[Chunk] = field(default_factory=list)
    fallback: str | None = None
    eval_fallback: str | None = None

    def seconds(self, kind: str) -> float:
        return sum(chunk.seconds for chunk in self.chunks if chunk.kind == kind)

    def count(self, kind: str) -> int:
        return sum(1 for chunk in self.chunks if chunk.kind == kind)

    def last_impl(self, kind: str) -> str:
        """The attention kernel of the latest chunk of ``kind`` ("" before any)."""
        return next((chunk.attention_impl for chunk in reversed(self.chunks) if chunk.kind == kind), "")

    def impl(self, kind: str, requested: str) -> str:
        """The kernel a new chunk of ``kind`` uses: ``sdpa`` once FlexAttention failed there (evaluation:
        or in training), unless a kernel other than auto/flex is requested; else ``requested``."""
        fallback = self.fallback if kind == "train" else self.eval_fallback or self.fallback
        return "sdpa" if fallback and requested in ("auto", "flex") else requested


@dataclass
class State:
    """The whole reproduction's record (see the module docstring)."""

    path: Path
    fingerprint: dict[str, Any]
    corpus_seconds: float | None = None
    eval_tokens: int | None = None
    device: str | None = None
    runs: dict[str, RunRecord] = field(default_factory=dict)
    lease: dict[str, Any] | None = None  # the lease preset's plan (kerple.reproduce.lease.LeasePlan)

    def run(self, pos_emb: str) -> RunRecord:
        return self.runs.setdefault(pos_emb, RunRecord())

    def save(self) -> None:
        doc = {"format": FORMAT, "fingerprint": self.fingerprint, "corpus_seconds": self.corpus_seconds,
               "eval_tokens": self.eval_tokens, "device": self.device,
               "runs": {name: asdict(record) for name, record in self.runs.items()}}
        if self.lease is not None:
            doc["lease"] = self.lease
        write_json_atomic(self.path, doc)

    @classmethod
    def load(cls, path: Path, fingerprint: dict[str, Any]) -> "State":
        """The state in ``path`` (a new one if there is none); refuses one made with other settings."""
        if not path.is_file():
            return cls(path, fingerprint)
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}")
            runs = {name: RunRecord(**{**record, "chunks": [Chunk(**chunk) for chunk in record["chunks"]]})
                    for name, record in doc["runs"].items()}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ReproduceError(f"{path}: not a reproduction state file ({error}); delete it or use another --work")
        changed = [f"{key} {doc['fingerprint'].get(key)!r} -> {value!r}" for key, value in fingerprint.items()
                   if doc["fingerprint"].get(key) != value]
        if changed:
            raise ReproduceError(f"{path.parent} was started with other settings ({'; '.join(changed)}): "
                                 "run with the settings it was started with, or pass another --work")
        return cls(path, fingerprint, doc.get("corpus_seconds"), doc.get("eval_tokens"), doc.get("device"), runs,
                   doc.get("lease"))

    @staticmethod
    def saved_fingerprint(path: Path) -> dict[str, Any] | None:
        """The fingerprint of the state in ``path``, if there is a readable one (a lease reuses its steps)."""
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        fingerprint = doc.get("fingerprint") if isinstance(doc, dict) else None
        return fingerprint if isinstance(fingerprint, dict) else None
