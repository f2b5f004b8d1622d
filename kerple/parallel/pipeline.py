"""Pipeline parallelism for :class:`kerple.model.GPTModel` on DeepSpeed's pipeline engine.

:func:`build_pipeline` turns a model that was built whole (so with a given seed every
``pipe_parallel_size`` starts from the same weights) into a :class:`GPTPipeline`, a
``deepspeed.pipe.PipelineModule`` that keeps only this rank's stages:

* Stage boundaries follow the reference's pipeline layer list (docs/reference-format.md §6, given by
  :meth:`kerple.checkpoint.neox_layout.NeoxAdapter.slots`): embedding, a parameter-free stage,
  the transformer layers, a parameter-free stage, final norm, LM head, partitioned so each stage
  holds an equal share of transformer layers (GPT-NeoX's ``type:transformer`` partitioning). A
  stage registers its modules under the model's own names (``embedding``, ``layers.<i>``,
  ``final_norm``, ``lm_head``, ``positional``), so its ``state_dict()`` is a part of the model's
  and its layer files come out of the same adapter.
* Each stage computes the positional distance tables once per micro-batch from the ONE shared
  positional module (``O(H·L)``, cheap next to attention), as the whole model does once per
  forward; only the hidden states ``[b, s, h]`` travel between stages.
* Tying: the positional parameters (KERPLE ``bias_p``/``bias_a``, T5 ``rpe.weight``, ...) are held
  by every stage with a transformer layer and must stay one set of values. They use DeepSpeed's
  own tied-weight machinery (the one behind ``TiedLayerSpec``), pointed at the shared module
  instead of a ``tied_modules`` entry so the keys stay the model's: the values are broadcast
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

from kerple.checkpoint.neox_layout import NeoxAdapter
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
    if model.lm_head is None:
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
        # The whole model, as a plain attribute (not a submodule): it builds every stage's attention
        # context from its positional module and attention settings. _build takes this stage's
        # modules out of it and drops the others.
        object.__setattr__(self, "_model", model)
        self._slots = NeoxAdapter.for_model(model).slots()
        layers = [parameter_free_stage if name is None else model.get_submodule(name) for name in self._slots]
        super().__init__(
            layers=layers,
            num_stages=num_stages,
            loss_fn=loss_fn,
            partition_method=f"type:^{TransformerLayer.__name__}$",
        )

    # --- construction (called by PipelineModule.__init__) ---------------------------------
    def _build(self) -> None:
        """Register this stage's modules under the model's names (DeepSpeed's own ``_build`` would
        register them as ``"<layer index>"``) and free the other stages' modules."""
        model = self._model
        local = range(self._local_start, self._local_stop)
        self._local_names = [name for index, name in enumerate(self._slots) if index in local and name is not None]
        self.layers = nn.ModuleDict()
        for name in self._local_names:
            module, (attribute, _, layer) = model.get_submodule(name), name.partition(".")
            if layer:
                self.layers[layer] = module
            else:
                self.add_module(attribute, module)
        if self.stage_id in self._positional_stages():
            self.positional = model.positional
        else:  # exposed, but not a submodule: its tensors are not this stage's to train or save
            object.__setattr__(self, "positional", model.positional)
        for name in ("embedding", "layers", "final_norm", "lm_head"):
            delattr(model, name)  # this stage holds its own; the others' are freed
        self._layer_specs = [
            layer if index in local else None for index, layer in enumerate(self._layer_specs)
        ]
        for param in self.parameters():
            mark_replicated(param, False)

    def _positional_stages(self) -> list[int]:
        """The stages holding the positional parameters (every one with a transformer layer,
        or only the embedding's stage for an input embedding such as ``learned``)."""
        if self._model.positional.kind == PositionKind.INPUT:
            return [self.stage_owner(0)]
        return sorted({self.stage_owner(index) for index, name in enumerate(self._slots) if name and name.startswith("layers.")})

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

    # DeepSpeed 0.19's tying is reachable only through TiedLayerSpec, which builds a new module per
    # key, registers it under ``tied_modules`` (renaming its tensors) and runs it as a pipeline layer;
    # no public hook ties a module the stages already hold. So the four methods below point
    # DeepSpeed's own broadcast / all-reduce at the shared positional module instead.
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
    def positional_parameters(self) -> list[nn.Parameter]:
        """The shared positional module's parameters (as :meth:`kerple.model.Decoder.positional_parameters`)."""
        return self._model.positional_parameters()

    def positional_metrics(self) -> dict[str, float]:
        """Their statistics (as :meth:`kerple.model.Decoder.positional_metrics`)."""
        return self._model.positional_metrics()

    @property
    def num_layers(self) -> int:
        """Transformer layers of the whole model."""
        return self._model.num_layers

    @property
    def local_indices(self) -> list[int]:
        """The reference pipeline indices of the modules this stage holds."""
        return [self._slots.index(name) for name in self._local_names]

    def forward(self, stage_input: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``tokens [b, s]`` (first stage) or hidden states ``[b, s, h]`` -> hidden states, or logits
        ``[b, s, V]`` on the last stage."""
        if isinstance(stage_input, (tuple, list)):
            (stage_input,) = stage_input
        model = self._model
        model.training = self.training  # read by the context for the kernel choice
        # Distance tables once per micro-batch on this stage, as GPTModel does once per forward.
        context = model.attention_context(stage_input.shape[1], stage_input.device)
        hidden = stage_input
        if "embedding" in self._local_names:
            hidden = self.embedding(hidden, context.q_positions, self.positional)  # [b, s] -> [b, s, h]
        # activation checkpointing, as in GPTModel.hidden_states
        hidden = run_layers(list(self.layers.values()), hidden, context, model.checkpoint_group())
        if "final_norm" in self._local_names:
            hidden = self.final_norm(hidden)
        if "lm_head" in self._local_names:
            hidden = F.linear(hidden, self.lm_head.weight)  # [b, s, V]
        return hidden
