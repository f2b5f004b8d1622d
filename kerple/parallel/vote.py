"""A vote among the ranks that the host does not wait for: whether any rank raised a flag a few steps ago.

The trainer asks every step whether a rank received a stop signal (SIGTERM from a scheduler, Ctrl-C),
so that all ranks stop and save at the same step. Answered at once, that question is a collective
whose result the host must read: an ``all_reduce`` and an ``.item()``, a wait for the device's whole
queue in every step of a multi-GPU run. :class:`LaggedVote` answers for the step ``lag`` steps back
instead. Each step launches its reduction and moves on; the answer read now is one the device
finished long ago, so reading it waits for nothing in practice. Every rank reads the same reduction
at the same step, so the ranks still agree on the step they stop at, ``lag`` steps after the signal.

* NCCL: the reduction is queued on the device, its result copied into pinned host memory behind it,
  and a CUDA event recorded; the answer ``lag`` steps later waits on that event alone.
* gloo (CPU tensors): the reduction runs asynchronously (``async_op=True``), and the answer waits on
  its handle, so a slow rank no longer holds the others at every step's vote.

With one rank there is nothing to agree on: the flag is the answer, at once.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch
import torch.distributed as dist

STOP_LAG = 2  # steps between a rank's flag and the step every rank acts on it


class LaggedVote:
    """``vote(flag)`` each step: True on the step ``lag`` steps after any rank voted True (see the module
    docstring). Every rank must call it once per step, in the same order."""

    def __init__(self, world_size: int, device: torch.device, group: Any = None, lag: int = STOP_LAG) -> None:
        if lag < 1:
            raise ValueError(f"lag {lag}: expected at least 1")
        self.world_size, self.device, self.group, self.lag = world_size, device, group, lag
        self._pending: deque[tuple[torch.Tensor, Callable[[], Any]]] = deque()

    def __call__(self, flag: bool) -> bool:
        if self.world_size == 1:
            return bool(flag)
        self._pending.append(self._launch(flag))
        if len(self._pending) <= self.lag:
            return False
        value, wait = self._pending.popleft()
        wait()
        return bool(value[0] > 0)

    def _launch(self, flag: bool) -> tuple[torch.Tensor, Callable[[], Any]]:
        """Start this step's reduction; returns where its result lands and how to wait for it."""
        if self.device.type == "cuda":
            value = torch.full((1,), float(flag), device=self.device)  # a fill kernel: no copy from the host
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)  # queued; the host goes on
            host = torch.empty(1, pin_memory=True)
            host.copy_(value, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            return host, done.synchronize
        value = torch.full((1,), float(flag))
        work = dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return value, work.wait
