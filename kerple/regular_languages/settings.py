"""What one regular-language run is given (thesis §6.4.2): the model's size and the training budget.

Kept apart from :mod:`kerple.regular_languages.bench` (which imports torch) so that
``tools/regular_languages.py`` can check its flags against these defaults, and refuse bad ones, in a
fraction of a second.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ARCH_NAMES: tuple[str, ...] = ("regulargpt", "transformer", "rnn")
"""The models a run can train: RegularGPT, a GPT-NeoX decoder with a relative embedding, an LSTM."""
PADDINGS: tuple[str, ...] = ("pad", "none")
"""RegularGPT's padding (thesis §6.2.1); the model's own list is :data:`kerple.model.regular.PADDINGS`."""


@dataclass
class RunSettings:
    """Model size and training budget of one run (tiny CPU defaults; the thesis' are in Table 6.5).

    The budget learns Parity Check from every seed tried (``benchmarks/regular_seeds.py``): Adam at
    1e-3 warmed up over the first 1,000 steps, at most 8,000 steps, stopping once the training loss
    is below 0.001. Without the warm-up, 1e-3 from the first step stalls some seeds at chance for
    good; 3e-4 throughout learns more of them, slowly (docs/regular-languages.md)."""

    hidden_size: int = 64
    num_heads: int = 4
    transformer_layers: int = 3
    chunk_size: int = 2
    thickness: int = 1
    padding: str = "pad"
    pos_emb: str = "rpe"
    steps: int = 8000
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 1000
    eval_samples: int = 100
    eval_batch: int = 50
    probability: float = 0.5
    stop_loss: float = 0.001  # stop once the mean loss of the last STOP_WINDOW steps is below (0: never)


STOP_WINDOW = 100


def resume_conflict(record: dict[str, Any], settings: RunSettings, lengths: list[int] | None) -> str | None:
    """Why an earlier run's ``record`` cannot stand for a run with ``settings`` tested on ``lengths``
    (``None``: not compared): the settings that differ, or the test lengths; ``None`` when it can."""
    now = asdict(settings)
    before = record.get("settings", {})
    changed = [f"{key} {before[key]!r} (now {now[key]!r})" for key in before if key in now and before[key] != now[key]]
    tested = [int(length) for length in record.get("accuracy", {})]
    if lengths is not None and tested and tested != lengths:
        changed.append(f"test lengths {tested[0]}-{tested[-1]} ({len(tested)})")
    if not changed:
        return None
    return f"{record['task']} {record.get('arch', 'regulargpt')} seed {record['seed']} run with {', '.join(changed)}"
