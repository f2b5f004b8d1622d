"""AdamW with fp32 master weights and global-norm clipping, each step a few foreach/fused kernels.

The optimizer of the single-replica layout (fp32 or bf16, ZeRO stage 0, no pipeline:
:func:`kerple.training.ds_config.optimizer_steps_itself`). DeepSpeed runs the engine (forward,
backward, the data-parallel gradient all-reduce, the LR schedule) and calls :meth:`MasterAdamW.step`
as it would any torch optimizer's. One step:

1. for a bf16 model, its bf16 gradients are copied into fp32 gradients of the fp32 master weights
   (one ``_foreach_copy_`` per dtype);
2. clipping (Pascanu et al. 2013, §3.2; the rule of DeepSpeed's and Megatron-LM's
   ``clip_grad_norm_``): the global L2 norm of the fp32 gradients, in which a parameter split over
   the tensor-parallel ranks counts on every rank and a replicated one on tensor-parallel rank 0
   only, summed over the tensor-parallel group; every gradient is multiplied by
   ``min(1, max_norm / (norm + 1e-6))``. The norm and the factor stay on the device;
3. torch's fused AdamW on the masters (Loshchilov & Hutter 2019, Algorithm 2);
4. the masters rounded back into the bf16 parameters (one ``_foreach_copy_``), and the fp32
   gradients dropped: kept, they would be alive through the next forward, whose end is a step's
   memory peak (at 162M, 0.6 GiB of a 7.8 GiB peak, ``benchmarks/peak_memory.py``); the caching
   allocator hands their blocks back at the next step.

This is the arithmetic of DeepSpeed's unfused fp16/bf16 optimizer, which a ``bf16`` block would
select at ZeRO 0, without its per-parameter Python loop (an fp32 copy, an overflow check and a norm
per parameter, every check and norm a host synchronization) and without its overflow skip, which
bf16 does not need: its exponent range is fp32's and it trains without a loss scale.

The masters start as exact copies of the fp32 parameters, before the model is cast to bf16.
:meth:`MasterAdamW.state_dict` of a bf16 model has the layout of DeepSpeed's unfused optimizer
(``optimizer_state_dict`` and the masters as ``fp32_groups``, with a loss scale of 1), the layout
bf16 checkpoints have always had, so checkpoints written with either optimizer resume with the
other; an fp32 model's is plain AdamW's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _unflatten_dense_tensors

# The keys DeepSpeed's unfused fp16/bf16 optimizer writes besides the inner state and the masters,
# with the values of a run without loss scaling.
NO_LOSS_SCALE = {"dynamic_loss_scale": False, "cur_scale": 1.0, "cur_iter": 0}


class MasterAdamW(torch.optim.AdamW):
    """Fused AdamW over fp32 masters of ``param_groups``' parameters, which train in ``dtype``, with
    clipping to ``max_norm`` (0: none) as in the module docstring.

    Below fp32 the masters are fp32 copies of the parameters as they are now, and the constructor
    then casts the parameters to ``dtype`` (buffers keep theirs, as DeepSpeed's bf16 cast does); in
    fp32 the masters are the parameters. After each step, ``_global_grad_norm`` holds the gradient
    norm as a 0-dim fp32 device tensor (the attribute DeepSpeed's engine reads for
    ``get_global_grad_norm``).
    """

    def __init__(self, param_groups: list[dict[str, Any]], *, dtype: torch.dtype = torch.float32,
                 max_norm: float = 0.0, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, model_parallel_group: dist.ProcessGroup | None = None,
                 model_parallel_rank: int = 0) -> None:
        from deepspeed.runtime.utils import is_model_parallel_parameter

        copies = dtype != torch.float32
        groups = [{**group, "params": [nn.Parameter(p.detach().float()) if copies else p for p in group["params"]]}
                  for group in param_groups]
        super().__init__(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
        params = [p for group in param_groups for p in group["params"]]
        masters = [m for group in self.param_groups for m in group["params"]]
        self.copies = list(zip(params, masters)) if copies else []  # (model parameter, its fp32 master)
        self.counted = [m for p, m in zip(params, masters) if model_parallel_rank == 0 or is_model_parallel_parameter(p)]
        self.max_norm = float(max_norm)
        self.group = model_parallel_group
        self._global_grad_norm: torch.Tensor | None = None
        self._devices_checked = False
        with torch.no_grad():
            for parameter, _ in self.copies:
                parameter.data = parameter.data.to(dtype)
        self._copy_back = _same_kind_pairs(self.copies)  # fixed tensors: grouped once, not every step

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Gradients to the masters, clipping, the fused AdamW update, masters back to the model."""
        if not self._devices_checked:
            self._check_devices()
        self._gradients_to_masters()
        self._global_grad_norm = self._clip()
        loss = super().step(closure)
        for targets, sources in self._copy_back:
            torch._foreach_copy_(targets, sources)
        for _, master in self.copies:
            master.grad = None
        return loss

    def _check_devices(self) -> None:
        """Masters are made on their parameters' device: a model moved after this optimizer was built
        would have its update computed elsewhere, so that is refused at the first step."""
        for parameter, master in self.copies:
            if parameter.device != master.device:
                raise ValueError(f"a parameter is on {parameter.device} but its fp32 master on {master.device}: "
                                 "move the model to its device before building MasterAdamW")
        self._devices_checked = True

    def _gradients_to_masters(self) -> None:
        """The model's gradients copied into fp32 gradients of the masters, made for this step as
        views of one buffer per device (one allocation, not one per parameter; dropped after it)."""
        masters = [master for parameter, master in self.copies if parameter.grad is not None]
        for same_device in _by_device_and_dtype(masters):
            buffer = torch.empty(sum(m.numel() for m in same_device), dtype=torch.float32, device=same_device[0].device)
            for master, piece in zip(same_device, _unflatten_dense_tensors(buffer, same_device)):  # one call
                master.grad = piece
        with_grad = [(master.grad, parameter.grad) for parameter, master in self.copies if parameter.grad is not None]
        for targets, sources in _same_kind_pairs(with_grad):
            torch._foreach_copy_(targets, sources)

    def _clip(self) -> torch.Tensor | None:
        """The global gradient norm (module docstring); multiplies the gradients down to ``max_norm``."""
        grads = [m.grad for group in self.param_groups for m in group["params"] if m.grad is not None]
        if not grads:
            return None
        squared = _sum_of_squares([m.grad for m in self.counted if m.grad is not None], grads[0].device)
        if self.group is not None:
            dist.all_reduce(squared, group=self.group)
        norm = squared.sqrt()
        if self.max_norm > 0.0:
            factor = (self.max_norm / (norm + 1e-6)).clamp(max=1.0)
            for same_kind in _by_device_and_dtype(grads):
                device = same_kind[0].device
                torch._foreach_mul_(same_kind, factor if factor.device == device else factor.to(device))
        return norm

    def state_dict(self) -> dict[str, Any]:
        """AdamW's state; with master copies, in DeepSpeed's unfused-optimizer layout (module docstring)."""
        inner = super().state_dict()
        if not self.copies:
            return inner
        steps = [int(state["step"]) for state in inner["state"].values() if "step" in state]
        masters = [list(group["params"]) for group in self.param_groups]
        return {**NO_LOSS_SCALE, "cur_iter": max(steps, default=0), "optimizer_state_dict": inner,
                "fp32_groups": masters}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Either layout of :meth:`state_dict`; masters saved in it replace the current ones, and
        are rounded into the model's parameters."""
        if "optimizer_state_dict" not in state_dict:
            super().load_state_dict(state_dict)
            return
        super().load_state_dict(state_dict["optimizer_state_dict"])
        with torch.no_grad():
            for group, saved in zip(self.param_groups, state_dict["fp32_groups"], strict=True):
                for master, value in zip(group["params"], saved, strict=True):
                    master.copy_(value)
            for parameter, master in self.copies:
                parameter.copy_(master)


def _same_kind_pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """``(target, source)`` pairs as ``(targets, sources)`` lists of one device and one dtype each (a
    foreach kernel's unit)."""
    groups: dict[tuple[Any, ...], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for target, source in pairs:
        targets, sources = groups.setdefault((target.device, target.dtype, source.dtype), ([], []))
        targets.append(target)
        sources.append(source)
    return list(groups.values())


def _by_device_and_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` grouped by (device, dtype), the unit one foreach kernel takes."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    return list(groups.values())


def _sum_of_squares(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Σ‖t‖² over ``tensors``, a 0-dim fp32 tensor on ``device`` (one foreach norm per device and dtype)."""
    if not tensors:
        return torch.zeros((), dtype=torch.float32, device=device)
    norms = [torch.stack(torch._foreach_norm(same_kind)) for same_kind in _by_device_and_dtype(tensors)]
    norms = [n if (n.device, n.dtype) == (device, torch.float32) else n.to(device, torch.float32) for n in norms]
    return (norms[0] if len(norms) == 1 else torch.cat(norms)).square().sum()
