"""Process groups for data, tensor (model) and pipeline parallelism, held in one explicit object.

Rank layout follows Megatron / GPT-NeoX and DeepSpeed's ``PipeModelDataParallelTopology``:
``rank = (stage * dp + data_rank) * mp + model_rank``. Tensor-parallel groups are blocks of
consecutive ranks (``[0, mp)``, ``[mp, 2mp)``, ...), data-parallel groups take every ``mp``-th rank
within one pipeline stage, and a pipeline stage is a block of ``dp * mp`` consecutive ranks. The
:class:`ParallelState` is created once by :func:`init_distributed`, passed to whatever needs a group
(DeepSpeed receives it as its ``mpu``), and torn down by :func:`teardown` - nothing is kept in
module-level globals.
"""

from __future__ import annotations

import gc
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


def cuda_wanted() -> bool:
    """True when a CUDA device exists and DeepSpeed was not told to use the CPU accelerator."""
    return torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "") != "cpu"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prepare_environment() -> None:
    """Fill in what a single process needs before DeepSpeed is imported.

    Sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` when absent (a
    launcher sets them for multi-process runs) and ``DS_ACCELERATOR=cpu`` when there is no CUDA
    device, so the same code path runs on a laptop and on a GPU node.
    """
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


@dataclass
class ParallelState:
    """This rank's place in the data x tensor x pipeline layout, and its process groups.

    It also offers the ``mpu`` interface DeepSpeed expects (``get_model_parallel_*``,
    ``get_data_parallel_*``), so ``deepspeed.initialize(mpu=state)`` reduces gradients over the
    data-parallel group only.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    model_parallel_size: int = 1
    pipe_parallel_size: int = 1
    data_parallel_group: Any = None
    model_parallel_group: Any = None
    pipe_parallel_group: Any = None
    megatron_initialized: bool = False
    _tp_groups_built: bool = field(default=False, repr=False)

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (self.model_parallel_size * self.pipe_parallel_size)

    @property
    def model_parallel_rank(self) -> int:
        return self.rank % self.model_parallel_size

    @property
    def data_parallel_rank(self) -> int:
        return (self.rank // self.model_parallel_size) % self.data_parallel_size

    @property
    def pipe_parallel_rank(self) -> int:
        """This rank's pipeline stage."""
        return self.rank // (self.model_parallel_size * self.data_parallel_size)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # --- DeepSpeed's mpu interface --------------------------------------------------------
    def get_model_parallel_rank(self) -> int:
        return self.model_parallel_rank

    def get_model_parallel_world_size(self) -> int:
        return self.model_parallel_size

    def get_model_parallel_group(self) -> Any:
        return self.model_parallel_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_rank

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self) -> Any:
        return self.data_parallel_group

    # --- collectives used by the trainer --------------------------------------------------
    def any_rank(self, flag: bool) -> bool:
        """True when ``flag`` is true on any rank (a collective: every rank must call it)."""
        if self.world_size == 1:
            return bool(flag)
        device = self.device if self.backend == "nccl" else torch.device("cpu")
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    def barrier(self) -> None:
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()

    def mean_over_data_parallel(self, value: float) -> float:
        """Average a Python float over the data-parallel group (for logging the loss)."""
        if self.data_parallel_size == 1:
            return value
        device = self.device if self.backend == "nccl" else torch.device("cpu")
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(tensor, group=self.data_parallel_group)
        return float(tensor.item()) / self.data_parallel_size


def init_distributed(model_parallel_size: int = 1, pipe_parallel_size: int = 1) -> ParallelState:
    """Initialise ``torch.distributed`` through DeepSpeed and build the process groups.

    ``nccl`` on CUDA, ``gloo`` on CPU. Raises ``ValueError`` when the world size is not a multiple
    of ``model_parallel_size * pipe_parallel_size``.
    """
    prepare_environment()
    import deepspeed  # after prepare_environment: DS_ACCELERATOR is read at import time

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    model_parallel_size = max(int(model_parallel_size), 1)
    pipe_parallel_size = max(int(pipe_parallel_size), 1)
    if world_size % (model_parallel_size * pipe_parallel_size) != 0:
        raise ValueError(
            f"world size {world_size} is not divisible by model_parallel_size ({model_parallel_size}) "
            f"x pipe_parallel_size ({pipe_parallel_size}); change the number of processes or the "
            "parallelism keys"
        )
    use_cuda = cuda_wanted()
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if not use_cuda:
        _skip_shared_memory_allreduce_build(deepspeed)
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)

    state = ParallelState(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=device,
        backend=backend,
        model_parallel_size=model_parallel_size,
        pipe_parallel_size=pipe_parallel_size,
    )
    if pipe_parallel_size == 1 and model_parallel_size > 1:
        _use_megatron_groups(state)
    else:
        _build_groups(state)
    return state


def _use_megatron_groups(state: ParallelState) -> None:
    """Set up megatron-core's ``parallel_state`` (its layers and ``vocab_parallel_cross_entropy``
    read the tensor-parallel group from there) and adopt its tensor- and data-parallel groups.

    megatron-core keeps these groups in its own module state; this project holds them in ``state``
    and passes them explicitly, and :func:`teardown` destroys megatron-core's copy. Its rank order
    (tensor-parallel ranks consecutive) is the one documented at the top of this module.
    """
    from megatron.core import parallel_state as megatron_state

    megatron_state.initialize_model_parallel(
        tensor_model_parallel_size=state.model_parallel_size, create_gloo_process_groups=False
    )
    state.megatron_initialized = True
    state.model_parallel_group = megatron_state.get_tensor_model_parallel_group()
    state.data_parallel_group = megatron_state.get_data_parallel_group()
    if megatron_state.get_tensor_model_parallel_rank() != state.model_parallel_rank:
        raise RuntimeError("megatron-core's tensor-parallel rank differs from rank % model_parallel_size")
    state._tp_groups_built = True


def _skip_shared_memory_allreduce_build(deepspeed: Any) -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory all-reduce kernel (minutes on first use).

    DeepSpeed 0.19 uses that kernel only for ``inference_all_reduce``; training collectives go
    through ``torch.distributed`` (gloo) either way, so marking it unavailable changes no result.
    """
    compatible = deepspeed.ops.__compatible_ops__
    compatible["deepspeed_shm_comm"] = False


def _build_groups(state: ParallelState) -> None:
    """Create the tensor-, data- and pipeline-parallel groups (every rank creates every group, in order).

    DeepSpeed's pipeline engine builds its own copies of the data and pipeline groups from the
    same layout; these are the ones the trainer uses (loss averaging, checkpoint records).
    """
    mp, pp = state.model_parallel_size, state.pipe_parallel_size
    dp = state.data_parallel_size

    def rank_of(stage: int, data: int, model: int) -> int:
        return (stage * dp + data) * mp + model

    for stage in range(pp):
        for data in range(dp):
            ranks = [rank_of(stage, data, model) for model in range(mp)]
            group = dist.new_group(ranks)
            if state.rank in ranks:
                state.model_parallel_group = group
    for stage in range(pp):
        for model in range(mp):
            ranks = [rank_of(stage, data, model) for data in range(dp)]
            group = dist.new_group(ranks)
            if state.rank in ranks:
                state.data_parallel_group = group
    for data in range(dp if pp > 1 else 0):
        for model in range(mp):
            ranks = [rank_of(stage, data, model) for stage in range(pp)]
            group = dist.new_group(ranks)
            if state.rank in ranks:
                state.pipe_parallel_group = group
    state._tp_groups_built = True


def teardown(state: ParallelState | None) -> None:
    """Leave the process group cleanly (multi-process gloo runs abort at exit otherwise).

    The caller drops its DeepSpeed engine first; this collects garbage, waits for every rank and
    destroys the default group.
    """
    gc.collect()
    if state is not None and state.megatron_initialized:
        from megatron.core import parallel_state as megatron_state

        megatron_state.destroy_model_parallel()
        state.megatron_initialized = False
    if dist.is_initialized():
        if state is not None and state.world_size > 1:
            dist.barrier()
        import deepspeed.comm

        # DeepSpeed's own call also drops the group objects DeepSpeed cached (its world-group
        # clone), so a later init_distributed in the same process starts clean.
        deepspeed.comm.destroy_process_group()
