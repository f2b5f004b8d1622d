"""Evaluation protocols: which windows of a token stream are read and which of their tokens are scored.

Every protocol is a pure function of the stream length and its settings. A window is described by
its start offset ``s`` in the 1-D token stream and its input length ``n``: the model reads
``stream[s : s + n]`` and is scored against the labels ``stream[s + 1 : s + n + 1]`` (the usual
next-token shift, as the reference's samples of ``seq_length + 1`` tokens). Only a *suffix* of each
window is scored: positions ``score_from .. n - 1``.

* ``nonoverlap`` (KERPLE paper §5.2, Table 3): consecutive windows of ``L`` tokens, each read with
  no earlier context, every position scored. By default every length scores the *same* ``T`` label
  tokens (``N`` windows at the base length, ``N/2`` at twice the base, ...); ``num_windows`` fixes
  the window count instead (the reference's evaluation used 320 windows at every length,
  docs/reference-format.md §5).
* ``sliding`` (ALiBi's evaluation): windows of ``L`` advanced by a stride ``S``; the first window
  scores all ``L`` positions, each later one only its last ``S``, so every scored token after the
  first window has at least ``L - S`` tokens of context.
* ``last_token`` (thesis §4.3.4, Fig. 4.3): the same ``N`` target tokens at every length, each
  predicted from exactly ``L - 1`` preceding tokens (a segment of ``L`` tokens whose last token is
  the target); only that prediction is scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kerple.evaluation.errors import ProtocolError

PROTOCOLS = ("nonoverlap", "sliding", "last_token")


@dataclass(frozen=True)
class WindowPlan:
    """The windows one evaluation length reads.

    ``starts[k]`` is the stream offset of window ``k``; every window reads ``input_length`` tokens
    and scores positions ``score_from[k] .. input_length - 1``.
    """

    protocol: str
    length: int
    input_length: int
    starts: np.ndarray  # int64 [num_windows]
    score_from: np.ndarray  # int64 [num_windows]

    @property
    def num_windows(self) -> int:
        return int(self.starts.shape[0])

    @property
    def scored_tokens(self) -> int:
        return int((self.input_length - self.score_from).sum())


def _check_lengths(lengths: list[int], stream_len: int, minimum: int) -> None:
    if not lengths:
        raise ProtocolError("no evaluation lengths given")
    for length in lengths:
        if length < minimum:
            raise ProtocolError(f"evaluation length {length} is below the minimum {minimum}")
    if stream_len < max(lengths) + 1:
        raise ProtocolError(
            f"--eval-lengths {max(lengths)} needs at least {max(lengths) + 1} tokens (a window plus its shifted "
            f"label), the split has {stream_len}: evaluate shorter lengths or a larger split"
        )


def nonoverlap(
    stream_len: int, lengths: list[int], *, num_tokens: int | None = None, num_windows: int | None = None
) -> list[WindowPlan]:
    """Plans for the paper's non-overlapping evaluation (§5.2), one per length.

    Default (``num_windows`` is None): every length scores the same label tokens
    ``stream[1 : T + 1]`` with ``T`` the largest multiple of the lengths' least common multiple
    (``max(lengths)`` for powers of two) that fits in the stream (or in ``num_tokens`` when given),
    so each length needs ``T / L`` windows. With ``num_windows`` every length reads that many windows.
    """
    _check_lengths(lengths, stream_len, minimum=1)
    if num_tokens is not None and num_windows is not None:
        raise ProtocolError("give at most one of num_tokens and num_windows")
    plans = []
    if num_windows is not None:
        if num_windows < 1:
            raise ProtocolError(f"num_windows must be positive, got {num_windows}")
        for length in lengths:
            if num_windows * length + 1 > stream_len:
                raise ProtocolError(
                    f"--num-windows {num_windows}: {num_windows} windows of {length} tokens need "
                    f"{num_windows * length + 1} tokens, the split has {stream_len}; pass at most "
                    f"--num-windows {(stream_len - 1) // length}"
                )
            starts = np.arange(num_windows, dtype=np.int64) * length
            plans.append(WindowPlan("nonoverlap", length, length, starts, np.zeros(num_windows, np.int64)))
        return plans
    total = _common_token_budget(stream_len, lengths, num_tokens, unit=math.lcm(*lengths))
    for length in lengths:
        count = total // length
        starts = np.arange(count, dtype=np.int64) * length
        plans.append(WindowPlan("nonoverlap", length, length, starts, np.zeros(count, np.int64)))
    return plans


def _common_token_budget(stream_len: int, lengths: list[int], num_tokens: int | None, unit: int | None = None) -> int:
    """Largest multiple of ``unit`` (default ``max(lengths)``) not above ``num_tokens`` (or the stream's capacity)."""
    longest = max(lengths)
    capacity = stream_len - 1  # the last token is only ever a label
    budget = capacity if num_tokens is None else min(num_tokens, capacity)
    if num_tokens is not None and num_tokens > capacity:
        raise ProtocolError(f"--num-tokens {num_tokens}: the split has only {capacity} labels to score; pass "
                            f"--num-tokens all or a smaller number")
    if budget < longest:
        raise ProtocolError(f"--num-tokens {budget} is fewer than one window of the longest length {longest}; pass "
                            f"--num-tokens {longest} or more")
    unit = unit or longest
    if budget < unit:
        tokens = f" or --num-tokens {unit}" if unit <= capacity else ""
        raise ProtocolError(
            f"lengths {', '.join(map(str, lengths))} tile the same tokens only in multiples of {unit} (their least "
            f"common multiple), more than the {budget} tokens scored; pass --num-windows N (N windows at every "
            f"length){tokens}"
        )
    return (budget // unit) * unit


def sliding(
    stream_len: int,
    lengths: list[int],
    *,
    stride: int,
    num_tokens: int | None = None,
    num_windows: int | None = None,
) -> list[WindowPlan]:
    """Plans for sliding-window evaluation (ALiBi): window ``k`` starts at ``k * stride``.

    The first window scores all ``L`` positions and window ``k >= 1`` its last ``stride``, so the
    scored labels are exactly ``stream[1 : L + (count - 1) * stride + 1]``. By default every length
    covers the same labels ``stream[1 : T + 1]`` (``T`` as in :func:`nonoverlap`; ``L`` must
    then be at most ``T`` and ``T - L`` a multiple of ``stride``); ``num_windows`` fixes the count.
    """
    _check_lengths(lengths, stream_len, minimum=1)
    if num_tokens is not None and num_windows is not None:
        raise ProtocolError("give at most one of num_tokens and num_windows")
    plans = []
    for length in lengths:
        if not 1 <= stride <= length:
            raise ProtocolError(f"stride must be in [1, {length}] for length {length}, got {stride}")
    total = None if num_windows is not None else _common_token_budget(stream_len, lengths, num_tokens)
    for length in lengths:
        if num_windows is not None:
            count = num_windows
            if count < 1 or length + (count - 1) * stride + 1 > stream_len:
                raise ProtocolError(
                    f"--num-windows {count}: {count} sliding windows of {length} with stride {stride} need "
                    f"{length + (count - 1) * stride + 1} tokens, the split has {stream_len}; pass at most "
                    f"--num-windows {max(1, (stream_len - 1 - length) // stride + 1)}"
                )
        else:
            if (total - length) % stride:
                raise ProtocolError(
                    f"with stride {stride}, length {length} cannot cover exactly the {total} tokens "
                    f"shared by all lengths; pick a stride dividing every length or pass --num-windows"
                )
            count = (total - length) // stride + 1
        starts = np.arange(count, dtype=np.int64) * stride
        score_from = np.full(count, length - stride, dtype=np.int64)
        score_from[0] = 0
        plans.append(WindowPlan("sliding", length, length, starts, score_from))
    return plans


def last_token(
    stream_len: int, lengths: list[int], *, num_windows: int | None = None
) -> list[WindowPlan]:
    """Plans for the thesis's last-token evaluation (§4.3.4, Fig. 4.3).

    The targets are the last tokens of consecutive disjoint segments of ``max(lengths)`` tokens:
    ``t_i = (i + 1) * max(lengths) - 1``. At length ``L`` target ``t_i`` is predicted from the
    ``L - 1`` tokens before it: the window reads ``stream[t_i - L + 1 : t_i]`` and only its last
    position is scored. ``num_windows`` (default: every segment that fits) is ``N``.
    """
    _check_lengths(lengths, stream_len, minimum=2)
    longest = max(lengths)
    available = stream_len // longest
    count = available if num_windows is None else num_windows
    if count < 1 or count > available:
        raise ProtocolError(
            f"--num-windows {count}: last_token needs {count} disjoint segments of {longest} tokens; the "
            f"split holds {available}; pass --num-windows from 1 to {available}"
        )
    targets = (np.arange(count, dtype=np.int64) + 1) * longest - 1
    plans = []
    for length in lengths:
        starts = targets - (length - 1)
        score_from = np.full(count, length - 2, dtype=np.int64)
        plans.append(WindowPlan("last_token", length, length - 1, starts, score_from))
    return plans


def build_plans(
    protocol: str,
    stream_len: int,
    lengths: list[int],
    *,
    stride: int | None = None,
    num_tokens: int | None = None,
    num_windows: int | None = None,
) -> list[WindowPlan]:
    """Dispatch on the protocol name (the ``--protocol`` flag of ``evaluate.py``)."""
    if protocol == "nonoverlap":
        return nonoverlap(stream_len, lengths, num_tokens=num_tokens, num_windows=num_windows)
    if protocol == "sliding":
        if stride is None:
            raise ProtocolError("the sliding protocol needs --stride")
        return sliding(stream_len, lengths, stride=stride, num_tokens=num_tokens, num_windows=num_windows)
    if protocol == "last_token":
        if num_tokens is not None:
            raise ProtocolError("last_token scores one token per window: use --num-windows, not --num-tokens")
        return last_token(stream_len, lengths, num_windows=num_windows)
    raise ProtocolError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
