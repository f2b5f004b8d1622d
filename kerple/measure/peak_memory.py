"""What holds a training step's peak memory: the allocations alive when the step's own allocations
peak, grouped by the code that made them.

The step's allocations come, in time order, from the allocator itself: on CUDA the caching
allocator's recorded history (``torch.cuda.memory._record_memory_history``; an allocation ends when
its free completes), on a CPU the profiler's allocation events (``profile_memory=True``). Each is
named by the innermost frame in kerple's own code that made it (``model/mlp.py:30 forward``), and on
a CPU also by the first operator that frame called around it (the profiler records Python
functions, not lines). What was allocated before the step (parameters, fp32 masters, optimizer state) is not
among them: :func:`resident_bytes` counts it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Event = tuple[int, int, str]  # (address, bytes: positive when allocated, negative when freed, where)


@dataclass
class Peak:
    """The most bytes a run of allocations held at once, and what held them then: ``(where, bytes,
    count)``, most bytes first."""

    bytes: int
    holders: list[tuple[str, int, int]]


def live_at_peak(events: Iterable[Event]) -> Peak:
    """The peak of ``events`` (module docstring). A free of an address not allocated among the events
    (made before they began) is not the step's and is passed over."""
    events = list(events)
    live: dict[int, int] = {}
    total = peak = peak_index = 0
    for index, (address, size, _) in enumerate(events):
        if size > 0:
            live[address] = size
            total += size
            if total > peak:
                peak, peak_index = total, index
        elif address in live:
            total -= live.pop(address)
    holders: dict[int, tuple[int, str]] = {}
    for address, size, where in events[:peak_index + 1]:  # replayed up to the peak
        if size > 0:
            holders[address] = (size, where)
        else:
            holders.pop(address, None)
    grouped: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for size, where in holders.values():
        grouped[where] += size
        counts[where] += 1
    return Peak(peak, [(where, size, counts[where]) for where, size in grouped.most_common()])


def _own_frame(path: str) -> str | None:
    """``path`` inside kerple's package (``model/mlp.py``), ``None`` outside it or inside this package.
    CUDA's frames give absolute paths, the profiler's paths relative to ``sys.path``."""
    _, found, tail = f"/{path}".rpartition("/kerple/")
    return tail if found and not tail.startswith("measure/") else None


def cuda_events(snapshot: dict[str, Any], device_index: int = 0) -> Iterator[Event]:
    """The allocations and completed frees of ``torch.cuda.memory._snapshot()``'s history."""
    for entry in snapshot["device_traces"][device_index]:
        if entry["action"] == "alloc":
            frames = [f for f in entry.get("frames", []) if _own_frame(f["filename"])]
            where = f"{_own_frame(frames[0]['filename'])}:{frames[0]['line']} {frames[0]['name']}" if frames else "?"
            yield entry["addr"], entry["size"], where
        elif entry["action"] == "free_completed":
            yield entry["addr"], -entry["size"], ""


def cpu_events(profiler: torch.profiler.profile) -> list[Event]:
    """The CPU allocations and frees a ``profile_memory=True, with_stack=True`` profile recorded."""
    from torch._C._profiler import _EventType

    found: list[tuple[int, Event]] = []
    stack: list[tuple[Any, str | None, str | None]] = [
        (root, None, None) for root in profiler.profiler.kineto_results.experimental_event_tree()]
    while stack:
        event, frame, op = stack.pop()
        kind = event.typed[0]
        if kind == _EventType.Allocation:
            fields = event.typed[1]
            if fields.device.type == "cpu":
                where = f"{frame or '?'} {op or ''}".strip()
                found.append((event.start_time_ns, (fields.ptr, fields.alloc_size, where)))
            continue
        if kind == _EventType.PyCall:  # named "<path>(<first line>): <function>"
            path, _, rest = event.name.partition("(")
            line, _, function = rest.partition("): ")
            own = _own_frame(path)
            frame, op = (f"{own}:{line} {function}", None) if own else (frame, op)
        elif kind == _EventType.TorchOp and op is None:
            op = event.name
        stack += [(child, frame, op) for child in event.children]
    return [event for _, event in sorted(found, key=lambda pair: pair[0])]


def resident_bytes(model: torch.nn.Module, optimizer: Any) -> int:
    """Bytes of the tensors a training step starts with: parameters, their gradients, and every tensor
    of the optimizer (its parameters, e.g. fp32 masters, and its state), each storage once."""
    tensors = [*model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        for group in optimizer.param_groups:
            tensors += [*group["params"]] + [p.grad for p in group["params"] if p.grad is not None]
        tensors += [value for state in optimizer.state.values() for value in state.values()
                    if isinstance(value, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())
