"""A prepared dataset as ``prepare_data.py`` described it in ``<prefix>.info.json``, and the config
keys that point a training or evaluation run at it (the jobs that prepare data, then train on it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PreparedData:
    """The dataset's prefix and ``split`` string, its tokenizer file and size, and per part (train,
    valid, test) its documents and tokens; ``source`` holds what a local source found and kept."""

    prefix: str
    split: str
    tokenizer_file: str
    vocab_size: int
    parts: dict[str, dict[str, int]] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    tokenizer_type: str = "HFTokenizer"

    @classmethod
    def from_info(cls, info_file: Path, prefix: str | None = None) -> PreparedData:
        """The dataset ``info_file`` describes (``prefix``: where it is now, when not where it was written)."""
        from kerple.data.tokenizers import build_tokenizer

        info = json.loads(Path(info_file).read_text())
        tokenizer = info["tokenizer"]  # what Tokenizer.describe() wrote: its type and files
        built = build_tokenizer(tokenizer["tokenizer_type"], tokenizer.get("vocab_file"), tokenizer.get("merge_file"))
        return cls(prefix=prefix or info["prefix"], split=info["split"], tokenizer_file=tokenizer["vocab_file"],
                   vocab_size=built.vocab_size, parts=info["parts"], source=info.get("source") or {},
                   tokenizer_type=tokenizer["tokenizer_type"])

    def tokens(self, part: str) -> int:
        return int(self.parts.get(part, {}).get("tokens", 0))

    def documents(self, part: str) -> int:
        return int(self.parts.get(part, {}).get("documents", 0))

    def config_overrides(self) -> dict[str, Any]:
        """The data keys of a run's config: ``data_path``, ``split``, the tokenizer and its size."""
        return {"data_path": self.prefix, "split": self.split, "tokenizer_type": self.tokenizer_type,
                "vocab_file": self.tokenizer_file, "vocab_size": self.vocab_size}
