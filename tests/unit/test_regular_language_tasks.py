"""Regular-language task generators (thesis §6.4.1) against hand-checked strings and brute force."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from kerple.regular_languages.tasks import LANGUAGES, TASKS, TaskError, get_task, modular_arithmetic_value, sample_batch

A, B = 0, 1  # even_pairs / parity_check alphabet {a, b}


def encode(text: str) -> np.ndarray:
    return np.array([{"a": A, "b": B}[c] for c in text])


def test_hand_checked_deletang_examples() -> None:
    # thesis §6.4.1: "aabba" has one ab and one ba (even pairs) and two b's (even parity)
    inputs = np.stack([encode("aabba"), encode("aabbb"), encode("babab")])
    assert inputs[0][0] == inputs[0][-1]  # even pairs <=> first == last
    pairs = [(row[1:] != row[:-1]).sum() for row in inputs]
    assert pairs == [2, 1, 4]
    # modular arithmetic, 5 = +, 6 = -, 7 = *: 1 + 2 - 4 = 4 (thesis), 1 + 2 * 3 = 2, 1 - 1 - 1 = 4,
    # 0 * 1 + 4 * 3 - 2 = 0 (Deletang et al.'s examples)
    assert modular_arithmetic_value(np.array([1, 5, 2, 6, 4])) == 4
    assert modular_arithmetic_value(np.array([1, 5, 2, 7, 3])) == 2
    assert modular_arithmetic_value(np.array([1, 6, 1, 6, 1])) == 4
    assert modular_arithmetic_value(np.array([0, 7, 1, 5, 4, 7, 3, 6, 2])) == 0


@pytest.mark.parametrize(
    ("task", "text", "label"),
    [
        ("parity_check", "aabba", 1),  # two b: even
        ("parity_check", "ababb", 0),  # three b: odd
        ("parity_check", "a", 1),
        ("even_pairs", "aabba", 1),
        ("even_pairs", "aabbb", 0),
    ],
)
def test_labels_of_hand_made_strings(task: str, text: str, label: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler's label for a given string: feed the string through a generator that returns it."""
    string = encode(text)

    class Fixed:
        def integers(self, low, high, size):
            return np.broadcast_to(string, size).copy()

        def random(self, size):
            return np.where(np.broadcast_to(string, size) == B, 0.0, 0.99)

    _, labels = sample_batch(get_task(task), len(text), 2, Fixed())  # type: ignore[arg-type]
    assert labels.tolist() == [label, label]


def test_cycle_navigation_thesis_example() -> None:
    class Fixed:
        def integers(self, low, high, size):
            return np.broadcast_to(np.array([0, 1, 0, 2, 1, 1]), size).copy()

    _, labels = sample_batch(get_task("cycle_navigation"), 6, 1, Fixed())  # type: ignore[arg-type]
    assert labels.tolist() == [2]  # thesis §6.4.1: 010211 stops at position 2


def _runs(text: str) -> list[str]:
    return [m.group(0) for m in re.finditer(r"0+|1+", text)]


def in_dyck(text: str, depth: int) -> bool:
    level = 0
    for c in text:
        level += 1 if c == "0" else -1
        if level < 0 or level > depth:
            return False
    return level == 0


ORACLES = {
    "d2": lambda s: in_dyck(s, 2),
    "d3": lambda s: in_dyck(s, 3),
    "d4": lambda s: in_dyck(s, 4),
    "d12": lambda s: in_dyck(s, 12),
    # no odd run of 1s immediately followed by an odd run of 0s
    "tomita3": lambda s: not any(
        a[0] == "1" and len(a) % 2 and b[0] == "0" and len(b) % 2 for a, b in zip(_runs(s), _runs(s)[1:])
    ),
    "tomita4": lambda s: "000" not in s,
    "tomita5": lambda s: s.count("0") % 2 == 0 and s.count("1") % 2 == 0,
    "tomita6": lambda s: (s.count("0") - s.count("1")) % 3 == 0,
}


@pytest.mark.parametrize("name", list(ORACLES))
def test_automata_match_the_definitions_on_every_short_string(name: str) -> None:
    dfa = LANGUAGES[name]
    for length in range(0, 11):
        for symbols in itertools.product("01", repeat=length):
            text = "".join(symbols)
            assert dfa.accepts([int(c) for c in text]) == ORACLES[name](text), (name, text)


def test_hand_checked_members() -> None:
    accepted = {"d2": ["0101", "0011", ""], "tomita3": ["1100", "100", "0"], "tomita4": ["1001", "00100"],
                "tomita5": ["0110", "1111"], "tomita6": ["01", "000", "1100"]}
    rejected = {"d2": ["000111", "10", "011"], "tomita3": ["10", "1110", "101"], "tomita4": ["1000"],
                "tomita5": ["01", "000"], "tomita6": ["0", "011"]}
    for name, strings in accepted.items():
        assert all(LANGUAGES[name].accepts([int(c) for c in s]) for s in strings), name
    for name, strings in rejected.items():
        assert not any(LANGUAGES[name].accepts([int(c) for c in s]) for s in strings), name


@pytest.mark.parametrize("name", list(TASKS))
def test_generators_are_deterministic_and_labelled_correctly(name: str) -> None:
    task = get_task(name)
    first = sample_batch(task, 12, 64, np.random.default_rng(7))
    second = sample_batch(task, 12, 64, np.random.default_rng(7))
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    inputs, labels = first
    assert inputs.min() >= 0 and inputs.max() < task.num_symbols
    assert labels.min() >= 0 and labels.max() < task.num_classes
    if name in ORACLES:
        for row, label in zip(inputs, labels):
            assert ORACLES[name]("".join(map(str, row))) == bool(label)
        assert 0.3 < labels.mean() < 0.7  # members and non-members in about equal numbers


def test_parity_probability_changes_the_symbol_frequency() -> None:
    inputs, _ = sample_batch(get_task("parity_check"), 200, 50, np.random.default_rng(0), probability=0.9)
    assert 0.87 < inputs.mean() < 0.93


def test_task_lengths_and_refusals() -> None:
    assert get_task("parity_check").train_max_length == 40 and get_task("parity_check").test_lengths[0] == 41
    assert get_task("parity_check").test_lengths[-1] == 500
    assert get_task("tomita3").train_max_length == 50 and get_task("d12").test_lengths[-1] == 100
    with pytest.raises(TaskError, match="unknown task"):
        get_task("parity")
    with pytest.raises(TaskError, match="probability"):
        sample_batch(get_task("parity_check"), 5, 1, np.random.default_rng(0), probability=1.5)


# Deletang et al. (2023) definitions, restated: Parity Check, 1 when the number of b is even; Even
# Pairs, 1 when the number of "ab" plus "ba" substrings is even; Cycle Navigation, the final position
# on a cycle of 5 from 0 with 0 = STAY, 1 = +1, 2 = -1 (the thesis' encoding, §6.4.1); Modular
# Arithmetic, digits 0-4 alternating with +, -, * (an odd length), evaluated with * first, modulo 5.
def reference_label(name: str, row: np.ndarray) -> int:
    if name == "parity_check":
        return int("".join("ab"[s] for s in row).count("b") % 2 == 0)
    if name == "even_pairs":
        text = "".join("ab"[s] for s in row)
        return int((text.count("ab") + text.count("ba")) % 2 == 0)
    if name == "cycle_navigation":
        return sum({0: 0, 1: 1, 2: -1}[int(s)] for s in row) % 5
    text = "".join(str(int(s)) if i % 2 == 0 else "+-*"[int(s) - 5] for i, s in enumerate(row))
    return eval(text) % 5  # Python's own parser: * binds before + and -, and % 5 is never negative


@pytest.mark.parametrize("name", ["parity_check", "even_pairs", "cycle_navigation", "modular_arithmetic"])
def test_deletang_labels_match_the_definitions_on_random_strings(name: str) -> None:
    task = get_task(name)
    for length in (1, 2, 7, 40, 41, 42, 120):
        inputs, labels = sample_batch(task, length, 200, np.random.default_rng(length))
        if name == "modular_arithmetic":  # Deletang et al.: an even length is reduced by one
            assert inputs.shape[1] == (length if length % 2 else max(1, length - 1))
            assert inputs[:, ::2].max() <= 4 and (inputs.shape[1] == 1 or inputs[:, 1::2].min() >= 5)
        else:
            assert inputs.shape == (200, length)
        assert [reference_label(name, row) for row in inputs] == labels.tolist(), (name, length)
    # every symbol drawn about equally often (uniform inputs, as in Deletang et al.)
    inputs, _ = sample_batch(task, 301, 200, np.random.default_rng(0))
    symbols = inputs[:, 1::2] - 5 if name == "modular_arithmetic" else inputs
    frequencies = np.bincount(symbols.ravel()) / symbols.size
    assert np.allclose(frequencies, 1 / len(frequencies), atol=0.01)
