"""Pipeline parallelism for :class:`kerple.model.GPTModel` on DeepSpeed's pipeline engine.

:func:`build_pipeline` turns a model that was built whole (so with a given seed every
``pipe_parallel_size`` starts from the same weights) into a :class:`GPTPipeline`, a
``deepspeed.pipe.PipelineModule`` that keeps only this rank's stages:

* Stage boundaries follow the reference's pipeline indices (docs/reference-format.md §6): the layer list is
  ``0`` embedding, ``1`` parameter-free, ``2..L+1`` transformer layers, ``L+2`` parameter-free,
  ``L+3`` final norm, ``L+4`` LM head, partitioned so each stage holds an equal share of transformer
  layers (GPT-NeoX's ``type:transformer`` partitioning). The local stages are registered under
  ``sequential.<N>``, so a stage's ``state_dict()`` holds exactly its layer files' keys.
* Each stage computes the positional distance tables once per micro-batch from the ONE shared
  positional module (``O(H·L)``, cheap next to attention), as the whole model does once per
  forward; only the hidden states ``[b, s, h]`` travel between stages.
* Tying: the positional parameters (KERPLE ``bias_p``/``bias_a``, T5 ``rpe.weight``, ...) are held
  by every stage with a transformer layer and must stay one set of values. They use DeepSpeed's
  own tied-weight machinery (the one behind ``TiedLayerSpec``), pointed at the shared module
  instead of a ``tied_modules`` entry so the keys stay the reference's: the values are broadcast
  from the first holding stage at construction, the engine all-reduces (sums) their gradients over
  the holding stages after the last backward of every step (``ReduceTiedGrads``), and copies off
  the first stage are marked as replicated so gradient clipping counts them once (see
  :func:`mark_replicated`; without it DeepSpeed leaves later stages out of the norm). Every
  stage then applies the same update to the same values.

Import this module after :func:`kerple.parallel.groups.init_distributed` (DeepSpeed reads
``DS_ACCELERATOR`` when it is first imported). Not supported here (refused by the trainer): tensor
and pipeline parallelism together, and a tied LM head (``no_weight_tying: false``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.pipe import PipelineModule
from torch import nn

from kerple.model.gpt import run_layers
from kerple.model.transformer import TransformerLayer
from kerple.positional.base import PositionKind

POSITIONAL_TIE = "positional"


def parameter_free_stage(hidden: torch.Tensor) -> torch.Tensor:
    """Pipeline indices 1 and L+2: the reference's parameter-free stages (no file, no keys)."""
    return hidden


def mark_replicated(param: nn.Parameter, replicated: bool) -> None:
    """Tell DeepSpeed's gradient-norm code whether this stage's copy of ``param`` is counted.

    DeepSpeed sums the squared norms over the whole model replica (all stages) but, off pipeline
    stage 0, counts only parameters marked ``model_parallel`` (fp32 and ZeRO 1 paths) and skips those
    marked ``ds_pipe_replicated`` (bf16 path); unmarked, the later stages' gradients would be left
    out of the clipping norm. A stage's own parameters are counted; tied copies off the first
    holding stage are not.
    """
    param.ds_pipe_replicated = replicated
    param.model_parallel = not replicated


def build_pipeline(model: nn.Module, num_stages: int, loss_fn: Any) -> GPTPipeline:
    """This rank's :class:`GPTPipeline` of ``model`` over ``num_stages`` stages (collective).

    ``model`` is a whole :class:`~kerple.model.GPTModel`; its stages owned by other ranks are
    dropped. ``loss_fn(logits, labels)`` runs on the last stage.
    """
    if str(model.num_layers + 4) not in model.sequential:
        raise ValueError("pipeline parallelism needs an untied LM head (no_weight_tying: true)")
    if model.num_layers < num_stages:
        raise ValueError(
            f"{model.num_layers} transformer layers cannot fill {num_stages} pipeline stages; "
            "lower pipe_parallel_size or add layers"
        )
    return GPTPipeline(model, num_stages, loss_fn)


class GPTPipeline(PipelineModule):
    """This rank's stages of a :class:`~kerple.model.GPTModel`; ``forward(tokens | hidden)``.

    Stage input: ``tokens [b, s]`` on the first stage, hidden states ``[b, s, h]`` elsewhere;
    output: hidden states, or logits ``[b, s, V]`` on the last stage.
    """

    def __init__(self, model: nn.Module, num_stages: int, loss_fn: Any) -> None:
        # The whole model, kept as a plain attribute: it owns the positional module and the
        # attention settings the stages' context is built from; its other stages are dropped
        # in _build.
        object.__setattr__(self, "_model", model)
        count = model.num_layers
        layers: list[Any] = [model.sequential["0"], parameter_free_stage]
        layers += [model.sequential[str(index + 2)] for index in range(count)]
        layers += [parameter_free_stage, model.sequential[str(count + 3)], model.sequential[str(count + 4)]]
        super().__init__(
            layers=layers,
            num_stages=num_stages,
            loss_fn=loss_fn,
            partition_method=f"type:^{TransformerLayer.__name__}$",
        )

    # --- construction (called by PipelineModule.__init__) ---------------------------------
    def _build(self) -> None:
        model = self._model
        local = range(self._local_start, self._local_stop)
        for key in list(model.sequential):
            if int(key) not in local:
                del model.sequential[key]
        self.sequential = model.sequential  # the same modules, under the same names
        # drop the references to other stages' modules so their memory is freed
        self._layer_specs = [
            layer if index in local else None for index, layer in enumerate(self._layer_specs)
        ]
        for param in self.parameters():
            mark_replicated(param, False)

    def _positional_stages(self) -> list[int]:
        """The stages holding the positional parameters (every one with a transformer layer,
        or only the embedding's stage for an input embedding such as ``learned``)."""
        if self.positional.kind == PositionKind.INPUT:
            return [self.stage_owner(0)]
        return sorted({self.stage_owner(index + 2) for index in range(self._model.num_layers)})

    def _index_tied_modules(self) -> dict[str, dict[str, Any]]:
        """DeepSpeed's tied-weight records for the shared positional module (module docstring)."""
        names = [name for name, param in self.positional.named_parameters() if param.requires_grad]
        stages = self._positional_stages()
        comms: dict[str, dict[str, Any]] = {}
        if not names or len(stages) < 2:
            return comms
        for data_rank in range(self._grid.data_parallel_size):
            ranks = [self._grid.stage_to_global(stage_id=stage, data=data_rank) for stage in stages]
            group = dist.new_group(ranks=ranks)  # every rank creates every group, in order
            if self.global_rank in ranks:
                comms[POSITIONAL_TIE] = {
                    "ranks": ranks,
                    "group": group,
                    "weight_attr": names,
                    "module": self.positional,
                }
                if self.global_rank != ranks[0]:
                    for param in self.positional.parameters():
                        mark_replicated(param, True)
        return comms

    def _synchronize_tied_weights(self) -> None:
        """Broadcast the tied values from the first holding stage (DeepSpeed's own version does it
        with autograd recording, which leaves a ``broadcast_`` node in the parameters' history)."""
        with torch.no_grad():
            super()._synchronize_tied_weights()

    def get_tied_weights_and_groups(self) -> list[tuple[torch.Tensor, Any]]:
        return [
            (self._recursive_getattr(comm["module"], name), comm["group"])
            for comm in self.tied_comms.values()
            for name in comm["weight_attr"]
        ]

    def allreduce_tied_weight_gradients(self) -> None:
        for weight, group in self.get_tied_weights_and_groups():
            if weight.grad is not None:
                dist.all_reduce(weight.grad, group=group)

    # --- use ---------------------------------------------------------------------------
    @property
    def positional(self) -> nn.Module:
        """The one positional module shared by this stage's layers."""
        return self._model.positional

    @property
    def local_indices(self) -> list[int]:
        """The reference pipeline indices of the modules this stage holds."""
        return [int(key) for key in self.sequential]

    def forward(self, stage_input: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
        if isinstance(stage_input, (tuple, list)):
            (stage_input,) = stage_input
        model = self._model
        model.training = self.training  # read by the context for the kernel choice
        # Distance tables once per micro-batch on this stage, as GPTModel does once per forward.
        context = model._context(stage_input.shape[1], stage_input.device, None)
        count = model.num_layers
        group = model.checkpoint_group()  # activation checkpointing, as in GPTModel.hidden_states
        hidden = stage_input
        layers: list[nn.Module] = []  # consecutive transformer layers not yet run
        for key, stage in self.sequential.items():
            index = int(key)
            if 2 <= index <= count + 1:
                layers.append(stage)
                continue
            if layers:
                hidden, layers = run_layers(layers, hidden, context, group), []
            if index == 0:
                hidden = stage(hidden, context.q_positions)  # [b, s] -> [b, s, h]
            elif index == count + 3:
                hidden = stage(hidden)
            elif index == count + 4:
                hidden = F.linear(hidden, stage.final_linear.weight)  # [b, s, V]
        if layers:
            hidden = run_layers(layers, hidden, context, group)
        return hidden
