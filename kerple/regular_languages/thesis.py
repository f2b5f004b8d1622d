"""The thesis' Table 6.1 (§6.4.2): length generalization on regular languages, Max / Avg in %.

Deletang et al.'s tasks are trained on length 40 and tested on every length 41-500; Bhattamishra et
al.'s (D_n, Tomita) on length 50 and tested on 51-100. Each entry is over 3 seeds. The baselines are
an RNN and a Transformer with Transformer-XL's relative positional embedding; RegularGPT has
``C = 2`` or ``C = 3`` (``K = 1``). Hyperparameters: Table 6.5 (width 256, 8 heads, batch 128,
100,000 steps, lr among 1e-4, 3e-4, 5e-4).
"""

from __future__ import annotations

# task -> column -> (max, avg)
TABLE_6_1: dict[str, dict[str, tuple[float, float]]] = {
    "even_pairs": {"rnn": (100.0, 100.0), "transformer": (99.7, 73.2), "regulargpt_c2": (100.0, 89.3), "regulargpt_c3": (100.0, 96.6)},
    "modular_arithmetic": {"rnn": (100.0, 100.0), "transformer": (21.9, 20.3), "regulargpt_c2": (96.4, 82.6), "regulargpt_c3": (21.2, 20.5)},
    "parity_check": {"rnn": (100.0, 98.9), "transformer": (52.3, 50.1), "regulargpt_c2": (100.0, 100.0), "regulargpt_c3": (100.0, 88.7)},
    "cycle_navigation": {"rnn": (100.0, 100.0), "transformer": (21.7, 20.6), "regulargpt_c2": (100.0, 100.0), "regulargpt_c3": (100.0, 78.6)},
    "d2": {"rnn": (100.0, 100.0), "transformer": (100.0, 80.1), "regulargpt_c2": (100.0, 100.0), "regulargpt_c3": (99.8, 96.5)},
    "d3": {"rnn": (100.0, 100.0), "transformer": (100.0, 77.8), "regulargpt_c2": (100.0, 99.7), "regulargpt_c3": (98.6, 93.0)},
    "d4": {"rnn": (100.0, 100.0), "transformer": (100.0, 82.6), "regulargpt_c2": (100.0, 98.7), "regulargpt_c3": (97.7, 91.6)},
    "d12": {"rnn": (100.0, 100.0), "transformer": (100.0, 80.3), "regulargpt_c2": (100.0, 99.8), "regulargpt_c3": (94.1, 90.4)},
    "tomita3": {"rnn": (100.0, 100.0), "transformer": (100.0, 94.4), "regulargpt_c2": (100.0, 99.7), "regulargpt_c3": (100.0, 99.9)},
    "tomita4": {"rnn": (100.0, 100.0), "transformer": (100.0, 70.0), "regulargpt_c2": (100.0, 99.8), "regulargpt_c3": (100.0, 99.3)},
    "tomita5": {"rnn": (100.0, 100.0), "transformer": (74.5, 74.5), "regulargpt_c2": (100.0, 99.8), "regulargpt_c3": (98.2, 84.1)},
    "tomita6": {"rnn": (100.0, 100.0), "transformer": (50.0, 50.0), "regulargpt_c2": (100.0, 98.5), "regulargpt_c3": (100.0, 65.7)},
}


def thesis_column(arch: str, chunk_size: int) -> str | None:
    """The Table 6.1 column of a model of this benchmark (``None`` when the thesis has none)."""
    if arch == "regulargpt":
        return f"regulargpt_c{chunk_size}" if chunk_size in (2, 3) else None
    return arch if arch in ("rnn", "transformer") else None
