"""The one state-dict adapter: a :class:`kerple.model.GPTModel`'s names <-> GPT-NeoX's checkpoint names.

The model names its tensors after its own structure; GPT-NeoX stores them by pipeline index
(docs/reference-format.md §6): ``sequential.<N>.<key>`` in memory, one file per ``N`` on disk.
This module is the only place that knows that layout; writers, the reader, the pipeline stages,
the Hugging Face export and the optimizer's parameter order all go through :class:`NeoxAdapter`.

=======================================  ==================================================
model (``GPTModel.state_dict()``)        checkpoint (``sequential.<N>.<key>``)
=======================================  ==================================================
``embedding.word_embeddings.weight``     ``sequential.0.word_embeddings.weight``
``positional.<k>`` (input embedding)     ``sequential.0.<k>`` (``position_embeddings.weight``)
``layers.<i>.<key>``                     ``sequential.<i+2>.<key>``
``positional.<k>`` (any other kind)      ``sequential.<i+2>.attention.<module>.<k>`` in every layer
``pad_embedding`` (RegularGPT's PAD)      ``sequential.0.pad_embedding``
``final_norm.<p>``                       ``sequential.<L+3>.norm.<p>``
``lm_head.weight`` (untied head)         ``sequential.<L+4>.final_linear.weight``
=======================================  ==================================================

Indices 1 and L+2 are parameter-free pipeline stages and hold nothing. ``<module>`` is the
embedding's ``state_dict_name`` (``rpe``, ``alibi_embed``, ``rotary_emb``; ``positional`` when it
names none). The reference builds one positional module and hands it to every layer, so every layer
file holds an identical copy of its tensors (docs/reference-format.md §2); reading checks that the
copies agree and keeps one. Which positional buffers are stored is the embedding's own decision
(``register_buffer(..., persistent=...)``): whatever its ``state_dict()`` holds is copied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

import torch
from torch import nn

from kerple import positional as registry
from kerple.checkpoint.errors import CheckpointError, ModelParallelError
from kerple.positional.base import PositionKind

T = TypeVar("T")
FIRST_LAYER = 2  # pipeline index of transformer layer 0 (index 1 is parameter-free)
QKV_KEY = "attention.query_key_value.weight"
WORD_EMBEDDINGS = "word_embeddings.weight"
PAD_EMBEDDING = "pad_embedding"  # RegularGPT's PAD token state (thesis §6.2.1), beside the word embeddings
POSITIONAL = "positional."
_KEY = re.compile(r"^sequential\.(\d+)\.(.+)$")
# a layer's own attention tensors; ``relative_scalars`` are RegularGPT's per-block r of thesis Eq. 6.1
_LAYER_OWN = ("attention.query_key_value.", "attention.dense.", "attention.relative_scalars")


def split_key(name: str) -> tuple[int, str]:
    """``sequential.<N>.<key>`` -> ``(N, key)``; :class:`ModelParallelError` for a key of another form."""
    match = _KEY.match(name)
    if match is None:
        raise ModelParallelError(f"state-dict key {name!r} is not of the form 'sequential.<index>.<key>'")
    return int(match.group(1)), match.group(2)


def join_key(index: int, key: str) -> str:
    """``(N, key)`` -> ``sequential.<N>.<key>``."""
    return f"sequential.{index}.{key}"


def layer_key(name: str) -> str:
    """The per-file part of ``sequential.<N>.<key>`` (a name without the prefix is returned as it is)."""
    match = _KEY.match(name)
    return name if match is None else match.group(2)


def is_positional(key: str) -> bool:
    """Whether a transformer-layer key belongs to the shared positional module (``attention.rpe.bias_p`` ...)."""
    return key.startswith("attention.") and not key.startswith(_LAYER_OWN)


def positional_module_key(key: str) -> str:
    """The positional module's own key of a per-layer key (``attention.rpe.bias_p`` -> ``bias_p``)."""
    return key.split(".", 2)[2]


def transformer_indices(state: Mapping[str, Any]) -> list[int]:
    """Sorted pipeline indices whose keys include the fused QKV weight."""
    return sorted({index for index, key in map(split_key, state) if key == QKV_KEY})


def infer_pos_emb(state: Mapping[str, Any]) -> str | None:
    """The embedding a checkpoint's keys imply, or ``None`` when they do not tell (KERPLE log vs
    power; ``none``, ``sinusoidal`` and ``sandwich`` store nothing)."""
    keys = {split_key(name)[1] for name in state}
    for key, name in (
        ("position_embeddings.weight", "learned"),
        ("attention.rotary_emb.inv_freq", "rotary"),
        ("attention.alibi_embed.slopes", "alibi"),
        ("attention.rpe.weight", "rpe"),
    ):
        if key in keys:
            return name
    return None


def check_shared_positional(state: Mapping[str, torch.Tensor], source: str) -> None:
    """Every layer's copy of a shared positional tensor must be identical (docs/reference-format.md §2, §6).

    Raises :class:`ModelParallelError` naming the tensor and the layers that differ from the first copy.
    """
    copies: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for name, tensor in state.items():
        index, key = split_key(name)
        if index > 0 and is_positional(key):
            copies.setdefault(key, []).append((index, tensor))
    for key, entries in copies.items():
        first_index, first = entries[0]
        differing = [
            index
            for index, tensor in entries[1:]
            if tensor.shape != first.shape or not torch.equal(tensor.to(first.dtype), first)
        ]
        if differing:
            raise ModelParallelError(
                f"{source}: the shared positional tensor {key!r} differs between layer {first_index} and "
                f"layer(s) {differing}; the reference stores one module in every layer file, so the copies "
                "must be identical (the checkpoint is corrupted or was edited)"
            )


@dataclass(frozen=True)
class NeoxAdapter:
    """GPT-NeoX's names for a model of ``num_layers`` layers and one positional embedding.

    ``positional_at_input``: the embedding acts on the token embeddings (``learned``,
    ``sinusoidal``), so its tensors sit beside the word embeddings at index 0. Otherwise each layer
    holds a copy under ``attention.<positional_module>.``.
    """

    num_layers: int
    positional_at_input: bool = False
    positional_module: str = "positional"

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def for_model(cls, model: nn.Module) -> NeoxAdapter:
        """The adapter of a :class:`~kerple.model.Decoder` (or of a pipeline stage of one)."""
        positional = model.positional
        if positional is None:  # a family without a shared positional module
            return cls(model.num_layers)
        return cls(model.num_layers, positional.kind == PositionKind.INPUT, positional.state_dict_name or "positional")

    @classmethod
    def for_embedding(cls, num_layers: int, pos_emb: str) -> NeoxAdapter:
        """The adapter of a model with ``num_layers`` layers and the registry's embedding ``pos_emb``."""
        family = registry.family(registry.canonical(pos_emb))
        return cls(num_layers, family.kind == PositionKind.INPUT, family.state_dict_name or "positional")

    @classmethod
    def for_reference(cls, state: Mapping[str, Any]) -> NeoxAdapter:
        """The adapter a checkpoint's own keys describe (layer count and where positional tensors sit)."""
        at_input, module = False, "positional"
        for name in state:
            index, key = split_key(name)
            if index == 0 and key not in (WORD_EMBEDDINGS, PAD_EMBEDDING):
                at_input = True
            elif index > 0 and is_positional(key):
                module = key.split(".")[1]
        return cls(len(transformer_indices(state)), at_input, module)

    # --- indices ----------------------------------------------------------------------------
    def layer_indices(self) -> range:
        return range(FIRST_LAYER, FIRST_LAYER + self.num_layers)

    @property
    def final_norm_index(self) -> int:
        return FIRST_LAYER + self.num_layers + 1

    @property
    def head_index(self) -> int:
        return FIRST_LAYER + self.num_layers + 2

    def slots(self) -> list[str | None]:
        """GPT-NeoX's pipeline layer list: position N holds the model's module name for index N
        (``embedding``, ``layers.<i>``, ``final_norm``, ``lm_head``) or ``None`` (parameter-free)."""
        return ["embedding", None, *(f"layers.{i}" for i in range(self.num_layers)), None, "final_norm", "lm_head"]

    def check_indices(self, state: Mapping[str, Any], source: Any) -> None:
        """Raise :class:`CheckpointError` unless ``state``'s indices are 0, 2..L+1, L+3 and (L+4)."""
        layers = transformer_indices(state)
        if not layers:
            raise CheckpointError(f"{source}: no transformer layer holds {QKV_KEY!r}; this is not a GPT-NeoX checkpoint")
        present = sorted({split_key(name)[0] for name in state})
        allowed = {0, *self.layer_indices(), self.final_norm_index, self.head_index}
        if layers != list(self.layer_indices()) or not set(present) <= allowed:
            raise CheckpointError(
                f"{source}: pipeline indices {present} do not follow the GPT-NeoX layout for {self.num_layers} layers "
                f"(0 embedding, {FIRST_LAYER}..{self.layer_indices()[-1]} layers, {self.final_norm_index} final norm, "
                f"{self.head_index} head)"
            )

    # --- model -> checkpoint ----------------------------------------------------------------
    def positional_key(self, key: str) -> str:
        """The reference key of the positional tensor ``key`` inside its file (index 0 or a layer's)."""
        return key if self.positional_at_input else f"attention.{self.positional_module}.{key}"

    def _place(self, name: str) -> tuple[int, str]:
        module, _, rest = name.partition(".")
        if module == "embedding":
            return 0, rest
        if name == PAD_EMBEDDING:
            return 0, name
        if module == "layers":
            layer, _, key = rest.partition(".")
            return FIRST_LAYER + int(layer), key
        if module == "final_norm":
            return self.final_norm_index, f"norm.{rest}"
        if module == "lm_head":
            return self.head_index, f"final_linear.{rest}"
        raise CheckpointError(f"model key {name!r} has no place in the GPT-NeoX checkpoint layout")

    def to_reference(self, state: Mapping[str, T]) -> dict[str, T]:
        """``sequential.<N>.<key>`` names for a model's state dict (whole, or one pipeline stage's part).

        The positional tensors go to index 0, or, as an identical copy, into every layer present in
        ``state`` (right after the layer's attention keys, where the reference's module sits).
        """
        files: dict[int, list[tuple[str, T]]] = {}
        positional = [(self.positional_key(n[len(POSITIONAL):]), v) for n, v in state.items() if n.startswith(POSITIONAL)]
        for name, value in state.items():
            if not name.startswith(POSITIONAL):
                index, key = self._place(name)
                files.setdefault(index, []).append((key, value))
        if positional and self.positional_at_input:
            files.setdefault(0, []).extend(positional)
        elif positional:
            holders = [index for index in files if index in self.layer_indices()]
            if not holders:
                raise CheckpointError("positional tensors but no transformer layer to hold them in the GPT-NeoX layout")
            for index in holders:
                items = files[index]
                cut = max((n for n, (key, _) in enumerate(items, 1) if key.startswith("attention.")), default=0)
                files[index] = items[:cut] + positional + items[cut:]
        return {join_key(index, key): value for index in sorted(files) for key, value in files[index]}

    def layer_files(self, state: Mapping[str, torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
        """A checkpoint state dict split into the layer files' contents ``{N: {key: tensor}}`` (CPU copies)."""
        files: dict[int, dict[str, torch.Tensor]] = {}
        for name, tensor in state.items():
            index, key = split_key(name)
            # a copy: saving a view would write its whole underlying storage
            files.setdefault(index, {})[key] = tensor.detach().to("cpu", copy=True).contiguous()
        return dict(sorted(files.items()))

    # --- checkpoint -> model ----------------------------------------------------------------
    def from_reference(self, state: Mapping[str, T], source: Any = "checkpoint") -> dict[str, T]:
        """The model's names for a checkpoint state dict; the inverse of :meth:`to_reference`.

        The per-layer positional copies must agree (:func:`check_shared_positional`); one is kept.
        The head file's copy of ``word_embeddings.weight`` (pipeline checkpoints with a tied head)
        is dropped. Keys with no place in the model keep their checkpoint name, so a load names them.
        """
        check_shared_positional(state, str(source))  # type: ignore[arg-type]
        out: dict[str, T] = {}
        for name, value in state.items():
            index, key = split_key(name)
            internal = self._model_name(index, key)
            if internal == "":
                continue
            out.setdefault(internal or name, value)
        return out

    def _model_name(self, index: int, key: str) -> str | None:
        """The model's name for ``key`` of file ``index``; ``""`` to drop it, ``None`` if it has no place."""
        if index == 0:
            if key == PAD_EMBEDDING:
                return key
            return f"embedding.{key}" if key == WORD_EMBEDDINGS else POSITIONAL + key
        if index in self.layer_indices():
            if is_positional(key):
                return POSITIONAL + positional_module_key(key)
            return f"layers.{index - FIRST_LAYER}.{key}"
        if index == self.final_norm_index and key.startswith("norm."):
            return "final_norm." + key[len("norm."):]
        if index == self.head_index and key.startswith("final_linear."):
            return "lm_head." + key[len("final_linear."):]
        if index == self.head_index and key == WORD_EMBEDDINGS:
            return ""
        return None

    # --- optimizer order --------------------------------------------------------------------
    def parameter_order(self, module: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """``module``'s trainable parameters (model names) in the order of their checkpoint keys.

        Optimizer states refer to parameters by position, so the order is the checkpoint's
        (index by index, the positional tensors at their first copy), not the model's registration
        order; each shared parameter appears once.
        """
        params = {name: param for name, param in module.named_parameters() if param.requires_grad}
        seen: set[int] = set()
        ordered = []
        for name in self.from_reference(self.to_reference(params)):
            if id(params[name]) not in seen:
                seen.add(id(params[name]))
                ordered.append((name, params[name]))
        return ordered
