"""Regular-language tasks of thesis §6.4.1 (Table 6.1), deterministic from a seed.

Every task maps a length ``T`` and a ``numpy.random.Generator`` to ``inputs [n, T]`` (token ids)
and ``labels [n]`` (class ids); models read the answer at the final position.

Deletang et al. (thesis §6.4.1), inputs uniform over the alphabet, labels computed:

* ``even_pairs``: {a, b}; 1 when the number of ``ab`` and ``ba`` pairs is even (first == last).
* ``modular_arithmetic``: digits {0..4} alternating with {+, -, *}, odd length (an even ``T``
  is reduced by one, as in Deletang et al.), evaluated with ``*`` before ``+``/``-``, modulo 5.
* ``parity_check``: {a, b}; 1 when the number of ``b`` is even; ``P(b) = probability`` (Table 6.2).
* ``cycle_navigation``: {0: STAY, 1: INCREASE, 2: DECREASE} on a cycle of 5 starting at 0; the
  label is the final position.

Bhattamishra et al. (Table 6.1's second section), membership (1) or not (0), half of the strings
drawn uniformly from the language and half uniformly from its complement (every string of a
length with no member, such as an odd-length Dyck string, is a negative):

* ``d2``, ``d3``, ``d4``, ``d12``: ``D_n``, bracket strings balanced with depth at most ``n``
  (``D_0 = ε``, ``D_n = (a D_{n-1} b)*``); tokens ``(`` = 0, ``)`` = 1.
* ``tomita3``: no odd run of 1s immediately followed by an odd run of 0s; ``tomita4``: no ``000``;
  ``tomita5``: even numbers of 0s and of 1s; ``tomita6``: ``#0 - #1`` divisible by 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kerple.errors import KerpleError


class TaskError(KerpleError):
    """An unknown task or an impossible sampling request."""


@dataclass(frozen=True)
class DFA:
    """A complete deterministic automaton: ``transitions[state][symbol] -> state``, start state 0."""

    transitions: tuple[tuple[int, ...], ...]
    accepting: frozenset[int]

    @property
    def num_symbols(self) -> int:
        return len(self.transitions[0])

    def accepts(self, string: np.ndarray | list[int]) -> bool:
        state = 0
        for symbol in string:
            state = self.transitions[state][int(symbol)]
        return state in self.accepting

    def completions(self, length: int, accept: bool) -> np.ndarray:
        """``counts[i, q]``: strings of length ``length - i`` leading from ``q`` into (or, with
        ``accept=False``, outside) the accepting set; float64 (exact below 2**53, ratios beyond)."""
        states = len(self.transitions)
        counts = np.zeros((length + 1, states))
        counts[length] = [float((q in self.accepting) == accept) for q in range(states)]
        table = np.array(self.transitions)  # [Q, S]
        for i in range(length - 1, -1, -1):
            counts[i] = counts[i + 1][table].sum(axis=1)
        return counts

    def sample(self, length: int, accept: bool, rng: np.random.Generator) -> np.ndarray | None:
        """A uniform random string of ``length`` in (or outside) the language; ``None`` if none exists."""
        counts = self.completions(length, accept)
        if counts[0, 0] == 0:
            return None
        table, state, out = np.array(self.transitions), 0, np.empty(length, dtype=np.int64)
        for i in range(length):
            weights = counts[i + 1][table[state]]
            symbol = int(rng.choice(self.num_symbols, p=weights / weights.sum()))
            out[i], state = symbol, int(table[state][symbol])
        return out


def dyck_dfa(depth: int) -> DFA:
    """``D_depth``: states 0..depth are the open-bracket depth, ``depth + 1`` is the dead state."""
    dead = depth + 1
    transitions = [(min(q + 1, dead) if q < depth else dead, q - 1 if q > 0 else dead) for q in range(depth + 1)]
    return DFA(tuple(transitions) + ((dead, dead),), frozenset({0}))


TOMITA: dict[str, DFA] = {
    # 0 no pending odd 1-run, 1 odd 1-run, 2 even 1-run, 3 odd 1-run then odd 0s, 4 ... even 0s, 5 dead
    "tomita3": DFA(((0, 1), (3, 2), (0, 1), (4, 5), (3, 1), (5, 5)), frozenset({0, 1, 2, 4})),
    # trailing zeros 0, 1, 2; 3 dead
    "tomita4": DFA(((1, 0), (2, 0), (3, 0), (3, 3)), frozenset({0, 1, 2})),
    # (#0 mod 2) + 2 (#1 mod 2)
    "tomita5": DFA(((1, 2), (0, 3), (3, 0), (2, 1)), frozenset({0})),
    # (#0 - #1) mod 3
    "tomita6": DFA(((1, 2), (2, 0), (0, 1)), frozenset({0})),
}
LANGUAGES: dict[str, DFA] = {"d2": dyck_dfa(2), "d3": dyck_dfa(3), "d4": dyck_dfa(4), "d12": dyck_dfa(12), **TOMITA}


def modular_arithmetic_value(expression: np.ndarray, modulus: int = 5) -> int:
    """Digits at even positions, operators ``5 = +``, ``6 = -``, ``7 = *`` at odd ones; ``*`` binds first."""
    total, term, sign = 0, int(expression[0]), 1
    for index in range(1, len(expression), 2):
        operator, digit = int(expression[index]), int(expression[index + 1])
        if operator == modulus + 2:
            term = term * digit
        else:
            total += sign * term
            term, sign = digit, (1 if operator == modulus else -1)
    return (total + sign * term) % modulus


@dataclass(frozen=True)
class Task:
    """A task: its name, alphabet size, number of classes, training length and sampler."""

    name: str
    num_symbols: int
    num_classes: int
    train_max_length: int
    test_lengths: range
    sample: Callable[[int, int, np.random.Generator, float], tuple[np.ndarray, np.ndarray]]


def _even_pairs(length: int, count: int, rng: np.random.Generator, probability: float) -> tuple[np.ndarray, np.ndarray]:
    inputs = rng.integers(0, 2, (count, length))
    pairs = (inputs[:, 1:] != inputs[:, :-1]).sum(axis=1)
    return inputs, (pairs % 2 == 0).astype(np.int64)


def _parity(length: int, count: int, rng: np.random.Generator, probability: float) -> tuple[np.ndarray, np.ndarray]:
    inputs = (rng.random((count, length)) < probability).astype(np.int64)  # b = 1 with P(b) = probability
    return inputs, (inputs.sum(axis=1) % 2 == 0).astype(np.int64)


def _cycle(length: int, count: int, rng: np.random.Generator, probability: float) -> tuple[np.ndarray, np.ndarray]:
    inputs = rng.integers(0, 3, (count, length))
    steps = np.where(inputs == 1, 1, np.where(inputs == 2, -1, 0))
    return inputs, steps.sum(axis=1) % 5


def _modular(length: int, count: int, rng: np.random.Generator, probability: float) -> tuple[np.ndarray, np.ndarray]:
    length = length if length % 2 else max(1, length - 1)
    inputs = np.empty((count, length), dtype=np.int64)
    inputs[:, ::2] = rng.integers(0, 5, (count, length // 2 + 1))
    inputs[:, 1::2] = rng.integers(5, 8, (count, length // 2))
    return inputs, np.array([modular_arithmetic_value(row) for row in inputs], dtype=np.int64)


def _membership(language: DFA) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    def sample(length: int, count: int, rng: np.random.Generator, probability: float) -> tuple[np.ndarray, np.ndarray]:
        inputs, labels = np.empty((count, length), dtype=np.int64), np.empty(count, dtype=np.int64)
        for row in range(count):
            wanted = bool(rng.random() < 0.5)
            string = language.sample(length, wanted, rng)
            if string is None:  # no string of this length on that side
                wanted = not wanted
                string = language.sample(length, wanted, rng)
            inputs[row], labels[row] = string, int(wanted)
        return inputs, labels

    return sample


DELETANG = {
    "even_pairs": (2, 2, _even_pairs),
    "modular_arithmetic": (8, 5, _modular),
    "parity_check": (2, 2, _parity),
    "cycle_navigation": (3, 5, _cycle),
}
TASKS: dict[str, Task] = {
    **{name: Task(name, s, c, 40, range(41, 501), f) for name, (s, c, f) in DELETANG.items()},
    **{name: Task(name, 2, 2, 50, range(51, 101), _membership(dfa)) for name, dfa in LANGUAGES.items()},
}


def get_task(name: str) -> Task:
    """The task ``name``; raises :class:`TaskError` naming the known ones."""
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


def sample_batch(
    task: Task, length: int, count: int, rng: np.random.Generator, probability: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` strings of ``length`` for ``task`` and their labels (``probability``: P(b), parity only)."""
    if length < 1 or count < 1:
        raise TaskError(f"length and count must be >= 1, got {length} and {count}")
    if not 0.0 < probability < 1.0:
        raise TaskError(f"--probability must lie in (0, 1), got {probability}")
    return task.sample(length, count, rng, probability)
