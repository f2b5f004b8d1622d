"""Command-line flags of the tools and benchmarks, checked as the config keys are.

A config key's number must be finite and inside the field's bounds (:func:`kerple.config.fields.
check_bounds`); the scripts under ``tools/`` and ``benchmarks/`` hold their numeric flags to the same
rule through :func:`check_flags`: ``--lr nan`` or ``--steps 0`` is one line, ``prog: error: --lr nan:
expected a finite number more than 0``, and exit status 2, before any work. The other helpers:
:func:`check_not_more` (one flag against another: a warm-up longer than the training),
:func:`number_list`, :func:`shape_flag` and :func:`name_list` (comma-separated values, each checked),
:func:`check_unique` (the same task twice), :func:`given_flags` and :func:`refuse_unused` (an option
typed for what the command does not run is refused, not ignored), and :func:`heavy_imports`, which
runs a script's checks before it loads torch. This module imports only the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kerple.errors import INTERRUPTED_STATUS, USER_ERROR_STATUS, KerpleError, UsageError, exit_on_interrupt


@dataclass(frozen=True)
class Bounds:
    """Where a flag's number may lie: ``least``/``most`` included, ``above``/``below`` excluded."""

    least: float | None = None
    most: float | None = None
    above: float | None = None
    below: float | None = None

    def describe(self) -> str:
        """``"at least 1"``, ``"more than 0"``, ``"from 0 to 1"``, ``"more than 0 and below 1"``."""
        if self.least is not None and self.most is not None:
            return f"from {self.least:g} to {self.most:g}"
        parts = []
        if self.least is not None:
            parts.append(f"at least {self.least:g}")
        if self.above is not None:
            parts.append(f"more than {self.above:g}")
        if self.most is not None:
            parts.append(f"at most {self.most:g}")
        if self.below is not None:
            parts.append(f"below {self.below:g}")
        return " and ".join(parts) or "any finite number"

    def holds(self, value: float) -> bool:
        """Whether the finite ``value`` lies inside."""
        return ((self.least is None or value >= self.least) and (self.most is None or value <= self.most)
                and (self.above is None or value > self.above) and (self.below is None or value < self.below))


AT_LEAST_1 = Bounds(least=1)
"""Counts: steps, seeds, samples, repeats, threads, jobs."""
AT_LEAST_0 = Bounds(least=0)
POSITIVE = Bounds(above=0)
"""Rates and times that must be more than zero (a learning rate, a budget in seconds)."""
PROBABILITY = Bounds(above=0, below=1)
"""A probability or significance level strictly between 0 and 1."""


def check_number(flag: str, value: float | None, bounds: Bounds, fix: str = "") -> None:
    """Refuse (:class:`UsageError`) a value that is not finite or lies outside ``bounds``; ``None``
    (a flag left out) passes. ``fix`` ends the message (e.g. ``"; 0 turns the stop off"``)."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{flag} {value}: expected a finite number {bounds.describe()}{fix}")
    if not bounds.holds(value):
        raise UsageError(f"{flag} {value}: expected {bounds.describe()}{fix}")


def dest_of(flag: str) -> str:
    """The attribute argparse stores ``flag`` under (``--stop-loss`` -> ``stop_loss``)."""
    return flag.lstrip("-").replace("-", "_")


def check_flags(args: argparse.Namespace, rules: Mapping[str, Bounds]) -> None:
    """:func:`check_number` for every ``flag -> bounds`` of ``rules`` on the parsed ``args``."""
    for flag, bounds in rules.items():
        check_number(flag, getattr(args, dest_of(flag)), bounds)


def check_not_more(flag: str, value: float | None, limit_flag: str, limit: float | None, why: str,
                   value_note: str = "") -> None:
    """Refuse ``flag``'s value above ``limit_flag``'s (``--warmup 9000`` with ``--steps 8000``);
    ``value_note`` follows the value (``" (the default)"``)."""
    if value is not None and limit is not None and value > limit:
        raise UsageError(f"{flag} {value}{value_note} is more than {limit_flag} {limit}: {why}")


def number_list(flag: str, text: str, bounds: Bounds, kind: Callable[[str], Any] = int,
                separator: str = ",") -> list[Any]:
    """``"512,2048"`` -> ``[512, 2048]``: every entry parsed by ``kind`` and inside ``bounds``; an
    empty list, a word that is not a number or a number outside is one :class:`UsageError`."""
    words = [word.strip() for word in str(text).split(separator)]
    name = ("integers" if kind is int else "numbers")
    listed = "comma-separated" if separator == "," else f"{separator}-separated"
    if not any(words):
        raise UsageError(f"{flag} {text!r}: expected {listed} {name}, e.g. {_example(bounds, kind)}")
    values = []
    for word in words:
        try:
            value = kind(word)
        except ValueError:
            raise UsageError(f"{flag} {text!r}: {word!r} is not one of the {listed} {name} "
                             f"expected, e.g. {_example(bounds, kind)}") from None
        if not (math.isfinite(value) and bounds.holds(value)):
            finite = "" if math.isfinite(value) else "a finite number "
            raise UsageError(f"{flag} {text!r}: every entry must be {finite}{bounds.describe()}, got {word}")
        values.append(value)
    return values


def shape_flag(flag: str, text: str, names: Sequence[str]) -> list[int]:
    """``"4,4,512,32"`` -> ``[4, 4, 512, 32]``: one positive integer for each of ``names``."""
    values = number_list(flag, text, AT_LEAST_1)
    if len(values) != len(names):
        raise UsageError(f"{flag} {text!r}: expected {len(names)} positive integers, {','.join(names)}")
    return values


def name_list(flag: str, text: str, choices: Sequence[str]) -> list[str]:
    """``"eager,sdpa"`` -> ``["eager", "sdpa"]``: at least one name, each among ``choices``, each once."""
    names = [name.strip() for name in str(text).split(",") if name.strip()]
    if not names:
        raise UsageError(f"{flag} {text!r}: name at least one of {', '.join(choices)}")
    for name in names:
        if name not in choices:
            raise UsageError(f"{flag}: {name!r} is not one of {', '.join(choices)}")
    check_unique(flag, names)
    return names


def _example(bounds: Bounds, kind: Callable[[str], Any]) -> str:
    low = bounds.least if bounds.least is not None else (bounds.above or 0) + 1
    return ",".join(str(kind(str(int(low) * factor))) for factor in (1, 2))


def check_unique(flag: str, values: Sequence[Any] | None) -> None:
    """Refuse a list flag that names one value twice (the same task run twice, recorded twice)."""
    seen: set[Any] = set()
    for value in values or ():
        if value in seen:
            raise UsageError(f"{flag}: {value} is named twice; name each once")
        seen.add(value)


_LEFT_OUT = object()


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The destinations of the options typed in ``argv`` (whatever their value, the default included),
    read by parsing ``argv`` once more into a namespace whose every attribute is a marker: argparse
    fills in a default only where the namespace has no value."""
    namespace = argparse.Namespace(**{action.dest: _LEFT_OUT for action in parser._actions  # noqa: SLF001
                                      if action.dest != argparse.SUPPRESS})
    parsed, _ = parser.parse_known_args(argv, namespace)
    return {name for name, value in vars(parsed).items() if value is not _LEFT_OUT}


def refuse_unused(given: Iterable[str], unused: Mapping[str, str]) -> None:
    """Refuse an option the user typed that the rest of the command does not use: ``unused`` maps a
    destination to why it would be ignored (``"--probability applies to parity_check only"``)."""
    for name in given:
        if name in unused:
            raise UsageError(f"--{name.replace('_', '-')}: {unused[name]}; drop it")


@contextlib.contextmanager
def heavy_imports(prog: str, check: Callable[[list[str]], object] | None) -> Iterator[None]:
    """Around a script's slow imports (torch takes seconds, tens on a loaded machine): first
    ``check(sys.argv[1:])``, the script's own light flag checks, so that a refused flag is one line,
    ``prog: error: ...``, and exit status 2 without the wait; then the imports, during which Ctrl-C
    ends the process at once with ``prog: interrupted`` and status 130 (nothing is written yet).
    ``check`` is ``None`` where the file is imported rather than run (``__name__ != "__main__"``)."""
    if check is not None:
        try:
            check(sys.argv[1:])
        except KerpleError as error:
            print(f"{prog}: error: {error}", file=sys.stderr)
            raise SystemExit(USER_ERROR_STATUS) from None
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            raise SystemExit(INTERRUPTED_STATUS) from None
    with exit_on_interrupt(prog):
        yield
