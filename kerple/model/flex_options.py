"""FlexAttention's kernel options on CUDA: chosen from the device, and stepped down when they fail.

FlexAttention compiles one Triton kernel for the forward and one for the backward (the backward at
the first ``.backward()``), with tile sizes, pipeline stages and warps that ``kernel_options``
may set (``fwd_``/``bwd_`` prefixed; docs/flex-attention.md §2 lists what was checked in
PyTorch's source). A tile too large for the device's shared memory fails to compile ("out of
resource"), and the GPU image's PyTorch (docs/development.md, Versions) has no retry: this module picks options from the device and the
score modification, and describes the smaller rungs that :class:`OptionsLadder` walks down.

* :func:`default_forward` / :func:`default_backward`: PyTorch's own defaults for the device class,
  head dimension and dtype (the starting rung; docs/flex-attention.md §2).
* :func:`forward_shared_memory` / :func:`backward_shared_memory`: the shared memory a rung needs,
  a model calibrated on the out-of-resource reports of an H100 (docs/flex-attention.md §3).
* :func:`choose_configs`: the first rung whose estimate fits the device's opt-in shared memory per
  block; :func:`kernel_options` turns a (forward, backward) pair into ``kernel_options``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace

import torch

logger = logging.getLogger(__name__)

SMALLEST_TILE = 16  # tiles are powers of two from 16 to 128, so each divides the BlockMask block (128)
_OUT_OF_RESOURCE = ("No valid triton configs", "out of resource")
_REQUIRED = re.compile(r"Required:\s*(\d+)")
_KERNEL = re.compile(r"out of resource:\s*(\S+)")


@dataclass(frozen=True)
class DeviceLimits:
    """What the option choice reads from a CUDA device."""

    name: str
    capability: tuple[int, int]
    shared_memory_per_block: int  # the opt-in maximum, bytes (what Triton reports as the hardware limit)


@dataclass(frozen=True)
class ForwardConfig:
    """Forward tile: ``block_m`` queries x ``block_n`` keys per step."""

    block_m: int
    block_n: int
    num_stages: int
    num_warps: int

    def options(self) -> dict[str, int]:
        return {"fwd_BLOCK_M": self.block_m, "fwd_BLOCK_N": self.block_n,
                "fwd_num_stages": self.num_stages, "fwd_num_warps": self.num_warps}

    def __str__(self) -> str:
        return f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} stages={self.num_stages} warps={self.num_warps}"


@dataclass(frozen=True)
class BackwardConfig:
    """Backward tiles: ``m1 x n1`` for the key/value gradients, ``m2 x n2`` for the query gradient.

    The backward template requires ``n1 % m1 == 0`` and ``m2 % n2 == 0``.
    """

    block_m1: int
    block_n1: int
    block_m2: int
    block_n2: int
    num_stages: int
    num_warps: int

    def options(self) -> dict[str, int]:
        return {"bwd_BLOCK_M1": self.block_m1, "bwd_BLOCK_N1": self.block_n1, "bwd_BLOCK_M2": self.block_m2,
                "bwd_BLOCK_N2": self.block_n2, "bwd_num_stages": self.num_stages, "bwd_num_warps": self.num_warps}

    def __str__(self) -> str:
        return (f"BLOCK_M1={self.block_m1} BLOCK_N1={self.block_n1} BLOCK_M2={self.block_m2} "
                f"BLOCK_N2={self.block_n2} stages={self.num_stages} warps={self.num_warps}")


@torch._dynamo.assume_constant_result
def device_limits(device: torch.device) -> DeviceLimits | None:
    """The limits of a CUDA ``device`` (Triton's opt-in shared memory per block); ``None`` elsewhere.

    Marked constant for TorchDynamo: inside an enclosing ``torch.compile`` it is evaluated once while
    tracing (Triton's driver query cannot be traced) and its result kept in the graph.
    """
    if device.type != "cuda":
        return None
    from triton.runtime import driver

    index = device.index if device.index is not None else torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(index)
    shared = int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    return DeviceLimits(properties.name, (properties.major, properties.minor), shared)


def _is_hopper_class(capability: tuple[int, int]) -> bool:
    """sm90 and sm10x share PyTorch's large-tile defaults; sm8x, sm11x and sm12x the smaller ones."""
    return capability == (9, 0) or capability[0] == 10


def default_forward(capability: tuple[int, int], head_dim: int, dtype: torch.dtype) -> ForwardConfig:
    """PyTorch's default forward tile for this device class (docs/flex-attention.md §2)."""
    if capability < (8, 0) or head_dim not in (64, 128):
        return ForwardConfig(64, 64, 3, 4)
    stages = 2 if capability[0] in (11, 12) else 3
    if dtype == torch.float32:
        if _is_hopper_class(capability) and head_dim == 128:
            return ForwardConfig(32, 64, stages, 4)
        return ForwardConfig(128, 32, stages, 4)
    if head_dim == 128:
        return ForwardConfig(128, 64, stages, 8)
    return ForwardConfig(128, 128 if _is_hopper_class(capability) else 64, stages, 4)


def default_backward(capability: tuple[int, int], head_dim: int, dtype: torch.dtype) -> BackwardConfig:
    """PyTorch's default backward tiles for this device class (docs/flex-attention.md §2)."""
    if dtype == torch.float32 or capability < (8, 0) or head_dim > 256:
        return BackwardConfig(16, 16, 16, 16, 1, 4)
    if _is_hopper_class(capability):
        if head_dim <= 128 and (head_dim >= 64 or capability[0] == 10):
            return BackwardConfig(64, 128, 128, 64, 3, 8 if capability == (9, 0) else 4)
        return BackwardConfig(64, 64, 64, 64, 3 if head_dim < 64 else 2, 4)
    if head_dim < 64:
        return BackwardConfig(32, 128, 128, 32, 3, 4)
    if capability[0] in (11, 12):
        return BackwardConfig(64, 64, 64, 64, 1 if head_dim >= 128 else 2, 4)
    return BackwardConfig(64, 64, 64, 64, 3 if capability[1] == 6 and head_dim == 128 else 2, 4)


def _rounded(head_dim: int) -> int:
    return 1 << max(head_dim - 1, 0).bit_length()


def _gathered_buffers(num_stages: int) -> int:
    return max(num_stages - 1, 1)


def forward_shared_memory(config: ForwardConfig, head_dim: int, itemsize: int, gathered_bytes: int) -> int:
    """Bytes of shared memory the forward kernel needs (estimate, docs/flex-attention.md §3).

    The query tile once, a key and a value tile per pipeline stage, and ``num_stages - 1`` buffered
    ``[BLOCK_M, BLOCK_N]`` tiles of values gathered by the score modification (a table read by
    distance) at ``gathered_bytes`` per score.
    """
    qkv = itemsize * _rounded(head_dim) * (config.block_m + 2 * config.num_stages * config.block_n)
    return qkv + gathered_bytes * config.block_m * config.block_n * _gathered_buffers(config.num_stages)


def backward_shared_memory(config: BackwardConfig, head_dim: int, itemsize: int, gathered_bytes: int) -> int:
    """Bytes of shared memory the backward kernel needs (estimate, docs/flex-attention.md §3).

    The forward's model applied to each of the backward's two loops (key/value gradients: resident
    ``n1`` keys and values, streamed ``m1`` queries and output gradients; query gradient: the
    converse), the larger of the two. Not calibrated on a device: the ladder covers its errors.
    """
    width, buffers = itemsize * _rounded(head_dim), _gathered_buffers(config.num_stages)

    def loop(resident: int, streamed: int) -> int:
        gathered = gathered_bytes * resident * streamed * buffers
        return width * (2 * resident + 2 * config.num_stages * streamed) + gathered

    return max(loop(config.block_n1, config.block_m1), loop(config.block_m2, config.block_n2))


def smaller_forward(config: ForwardConfig) -> ForwardConfig | None:
    """The next rung down: fewer stages (to 2), then half ``BLOCK_N``, half ``BLOCK_M``, one stage."""
    if config.num_stages > 2:
        return replace(config, num_stages=config.num_stages - 1)
    if config.block_n > 2 * SMALLEST_TILE:
        return replace(config, block_n=config.block_n // 2)
    if config.block_m > 2 * SMALLEST_TILE:
        return replace(config, block_m=config.block_m // 2)
    if config.num_stages > 1:
        return replace(config, num_stages=1)
    return None


def smaller_backward(config: BackwardConfig) -> BackwardConfig | None:
    """The next rung down: fewer stages (to 2), then the larger tile of each pair halved to the
    smaller one, then all four tiles halved (4 warps), then one stage; divisibility is kept."""
    if config.num_stages > 2:
        return replace(config, num_stages=config.num_stages - 1)
    if config.block_n1 > config.block_m1 or config.block_m2 > config.block_n2:
        return replace(config, block_n1=max(config.block_n1 // 2, config.block_m1),
                       block_m2=max(config.block_m2 // 2, config.block_n2))
    if config.block_m1 > SMALLEST_TILE and config.block_n2 > SMALLEST_TILE:
        return BackwardConfig(config.block_m1 // 2, config.block_n1 // 2, config.block_m2 // 2,
                              config.block_n2 // 2, config.num_stages, 4)
    if config.num_stages > 1:
        return replace(config, num_stages=1)
    return None


def choose_configs(
    limits: DeviceLimits, head_dim: int, dtype: torch.dtype, gathered_bytes: int
) -> tuple[ForwardConfig, BackwardConfig]:
    """The forward and backward rungs to start from: PyTorch's defaults for the device, stepped down
    until the shared-memory estimate fits ``limits.shared_memory_per_block`` (the last rung if none
    does). ``gathered_bytes``: bytes per score gathered by the score modification (0: closed form)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    forward = default_forward(limits.capability, head_dim, dtype)
    while forward_shared_memory(forward, head_dim, itemsize, gathered_bytes) > limits.shared_memory_per_block:
        smaller = smaller_forward(forward)
        if smaller is None:
            break
        forward = smaller
    backward = default_backward(limits.capability, head_dim, dtype)
    while backward_shared_memory(backward, head_dim, itemsize, gathered_bytes) > limits.shared_memory_per_block:
        smaller = smaller_backward(backward)
        if smaller is None:
            break
        backward = smaller
    return forward, backward


def kernel_options(forward: ForwardConfig, backward: BackwardConfig) -> dict[str, int | bool]:
    """``kernel_options`` for ``flex_attention``: both configs, prefixed, and the main kernel forced
    (the decoding kernel, which PyTorch picks below 128 queries, sizes its tiles differently)."""
    return {**forward.options(), **backward.options(), "FORCE_USE_FLEX_ATTENTION": True}


def _chain(error: BaseException | None):  # type: ignore[no-untyped-def]
    """``error`` and the exceptions it was raised from, each once."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def failed_kernel(error: BaseException) -> str | None:
    """The FlexAttention kernel Triton's out-of-resource message names (``triton_tem_fused_flex_attention_0``,
    ``..._backward_1``), or ``None``."""
    for link in _chain(error):
        match = _KERNEL.search(str(link))
        if match and "flex_attention" in match.group(1):
            return match.group(1)
    return None


def required_shared_memory(error: BaseException) -> int | None:
    """The bytes of shared memory a failed kernel asked for (Triton's "Required: N"), read through the
    exception chain; ``None`` when no message names it."""
    for link in _chain(error):
        match = _REQUIRED.search(str(link))
        if match:
            return int(match.group(1))
    return None


def is_out_of_resource(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it was raised from) is Triton's out-of-resource failure:
    ``BackendCompilerFailed``/``InductorError`` or ``RuntimeError`` naming "No valid triton configs"
    or "out of resource". A CUDA out-of-memory error is not one."""
    return any(text in str(link) for link in _chain(error) for text in _OUT_OF_RESOURCE)


LadderKey = tuple[str, str, int, str]  # (device name, dtype, head_dim, kind of score modification)


class OptionsLadder:
    """The options in use per (device, dtype, head_dim, kind), stepped down on out-of-resource failures.

    A key starts at :func:`choose_configs`; :meth:`step_down` moves the phase that failed (forward or
    backward) to its next smaller rung and remembers it, so later calls start there; :meth:`confirm`
    logs a key's options once, the first time a call with them succeeds.
    """

    def __init__(self) -> None:
        self._rungs: dict[LadderKey, tuple[ForwardConfig, BackwardConfig]] = {}
        self._sizes: dict[LadderKey, tuple[int, int]] = {}  # (itemsize, gathered bytes) of each key
        self._steps: dict[LadderKey, int] = {}
        self._logged: set[LadderKey] = set()

    def options(self, key: LadderKey, limits: DeviceLimits, dtype: torch.dtype, gathered_bytes: int) -> dict:
        """The ``kernel_options`` of ``key`` (chosen from ``limits`` on first use)."""
        if key not in self._rungs:
            self._rungs[key] = choose_configs(limits, key[2], dtype, gathered_bytes)
            self._sizes[key] = (torch.empty((), dtype=dtype).element_size(), gathered_bytes)
        return kernel_options(*self._rungs[key])

    def failed_phase(self, key: LadderKey, error: BaseException, raised_in: str) -> str:
        """The phase ("forward" or "backward") whose kernel ``error`` reports out of shared memory.

        Where the error was raised does not settle it: Inductor may compile both kernels of a call
        (and, under ``training.compile``, of a whole layer) at once. Triton's message names the kernel
        (``triton_tem_fused_flex_attention_backward_…``): that decides. Without a name, the
        "Required: N" it reports is compared with this key's estimate of each phase
        (:func:`forward_shared_memory`, :func:`backward_shared_memory`) and the nearer one is blamed
        (a tie, or no size either: ``raised_in``).
        """
        named = failed_kernel(error)
        if named is not None:
            return "backward" if "backward" in named else "forward"
        required = required_shared_memory(error)
        if required is None or key not in self._rungs:
            return raised_in
        forward, backward = self._rungs[key]
        itemsize, gathered = self._sizes[key]
        estimates = {"forward": forward_shared_memory(forward, key[2], itemsize, gathered),
                     "backward": backward_shared_memory(backward, key[2], itemsize, gathered)}
        return min(estimates, key=lambda phase: (abs(estimates[phase] - required), phase != raised_in))

    def step_down(self, key: LadderKey, phase: str) -> bool:
        """Move ``phase`` ("forward" or "backward") of ``key`` one rung down; ``False`` at the bottom."""
        forward, backward = self._rungs[key]
        smaller = smaller_forward(forward) if phase == "forward" else smaller_backward(backward)
        if smaller is None:
            return False
        self._rungs[key] = (smaller, backward) if phase == "forward" else (forward, smaller)
        self._steps[key] = self._steps.get(key, 0) + 1
        logger.warning("FlexAttention %s kernel out of shared memory on %s (%s, head_dim %d, %s); retrying with %s",
                       phase, key[0], key[1], key[2], key[3], smaller)
        return True

    def confirm(self, key: LadderKey) -> None:
        """Log the options of ``key`` the first time they worked."""
        if key in self._logged:
            return
        self._logged.add(key)
        forward, backward = self._rungs[key]
        logger.info("FlexAttention kernel options on %s (%s, head_dim %d, %s): forward %s; backward %s%s",
                    key[0], key[1], key[2], key[3], forward, backward,
                    f" (after {self._steps[key]} out-of-resource retries)" if key in self._steps else "")

    def describe(self, key: LadderKey) -> str:
        """``key``'s current rungs in words: ``forward BLOCK_M=... ; backward BLOCK_M1=...``."""
        forward, backward = self._rungs[key]
        return f"forward {forward}; backward {backward}"

    def keys(self) -> list[LadderKey]:
        """Every key that has options."""
        return list(self._rungs)
