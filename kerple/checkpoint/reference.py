"""Read GPT-NeoX / KERPLE checkpoint directories (docs/reference-format.md §6) into one full state dict.

Handles:

* the directory given either as the ``save`` folder (``latest`` names the tag, or ``iteration``
  picks ``global_step<N>``) or as the tag folder itself;
* the **pipeline** layout, ``layer_<II>-model_<MM>-model_states.pt`` with the index gaps
  (0 embedding, 2..L+1 layers, L+3 final norm, L+4 head; 1 and L+2 have no file), and the
  **sequential** layout, ``sequential.<N>.`` keys in ``mp_rank_<MM>_model_states.pt['module']``;
* several model-parallel ranks, merged with :func:`kerple.checkpoint.sharding.merge_model_parallel`;
* the shared positional tensors (``attention.rpe.bias_p`` ...) stored in every layer: the copies
  must agree (:func:`~kerple.checkpoint.neox_layout.check_shared_positional`);
* the reference's ``pos_emb`` strings (``kerple_power_ap_`` ...) resolved by the registry, from
  ``args`` or from the run's ``configs/*.yml``.

Every file is read with :func:`kerple.checkpoint.safe_load.safe_torch_load` (no code runs unless
``trust``). The result keeps the checkpoint's names, ``sequential.<N>.<reference key>``; its
:meth:`LoadedCheckpoint.model_state` gives the model's names through the checkpoint's
:class:`~kerple.checkpoint.neox_layout.NeoxAdapter`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from kerple.checkpoint.errors import CheckpointError, ModelParallelError
from kerple.checkpoint.files import (
    LAYER_FILE,
    MP_FILE,
    checkpoint_to_read,
    layer_file_name,
    mp_rank_file_name,
    plain_args,
    trailing_step,
)
from kerple.checkpoint.neox_layout import FIRST_LAYER, WORD_EMBEDDINGS, NeoxAdapter, check_shared_positional, infer_pos_emb, join_key
from kerple.checkpoint.safe_load import safe_torch_load
from kerple.model import families
from kerple.checkpoint.sharding import ShardSpec, merge_model_parallel


@dataclass
class LoadedCheckpoint:
    """A checkpoint read into memory.

    ``state_dict``: full (model-parallel merged) tensors keyed ``sequential.<N>.<key>``, dtypes as
    stored. ``args``: the ``args`` record of ``mp_rank_00`` as a dict. ``config``: the merged
    ``configs/*.yml`` with keys normalised to underscores (empty when absent). ``pos_emb``: the
    canonical registry name, or the raw string when the registry does not know it, or ``None``.
    ``adapter``: the GPT-NeoX names the keys follow (layer count, where the positional tensors sit).
    """

    path: Path
    iteration: int
    layout: str
    model_parallel_size: int
    state_dict: dict[str, torch.Tensor]
    args: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    pos_emb: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    is_kerple_format: bool = False

    @property
    def adapter(self) -> NeoxAdapter:
        return NeoxAdapter.for_reference(self.state_dict)

    @property
    def num_layers(self) -> int:
        """Number of transformer layers (files or keys holding ``attention.query_key_value.weight``)."""
        return self.adapter.num_layers

    def model_state(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """``state`` (default: :attr:`state_dict`, or one model-parallel rank's part of it) under the model's names."""
        return self.adapter.from_reference(self.state_dict if state is None else state, self.path)


def read_config_files(checkpoint_dir: Path) -> dict[str, Any]:
    """Merge ``configs/*.yml`` (sorted by name) with keys normalised to underscores; later files win."""
    merged: dict[str, Any] = {}
    folder = checkpoint_dir / "configs"
    if not folder.is_dir():
        return merged
    for path in sorted(list(folder.glob("*.yml")) + list(folder.glob("*.yaml")) + list(folder.glob("*.json"))):
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise CheckpointError(f"cannot parse {path}: {err}") from err
        if isinstance(data, dict):
            merged.update({str(key).replace("-", "_"): value for key, value in data.items()})
    return merged


def canonical_pos_emb(name: str | None) -> str | None:
    """The registry name of a reference ``pos_emb`` string (unknown strings are returned as given)."""
    if name is None:
        return None
    from kerple import positional

    try:
        return positional.canonical(str(name))
    except KeyError:
        return str(name)


def _strip_prefix(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Drop a DeepSpeed ``module.`` prefix; keep only tensors."""
    out = {}
    for name, value in state.items():
        if name.startswith("module."):
            name = name[len("module.") :]
        if isinstance(value, torch.Tensor):
            out[name] = value
    return out


def missing_pipeline_indices(indices: list[int], num_layers: int | None, untied_head: bool = False) -> list[list[int]]:
    """The pipeline indices a complete GPT-NeoX checkpoint has but ``indices`` (its layer files)
    lacks: 0, 2..L+1 and L+3 are required, L+4 too for an untied head. Without ``num_layers`` the
    last file is the final norm or the head; each reading that misses fewest files is returned
    (two when they tie), and ``[]`` when nothing is missing."""
    candidates = [(num_layers, untied_head)] if num_layers else [(max(indices) - 3, False), (max(indices) - 4, True)]
    readings = []
    for layers, head in candidates:
        if layers >= 1:
            expected = {0, *range(FIRST_LAYER, FIRST_LAYER + layers), FIRST_LAYER + layers + 1}
            expected |= {FIRST_LAYER + layers + 2} if head else set()
            readings.append(sorted(expected - set(indices)))
    fewest = min(map(len, readings), default=0)
    return [] if fewest == 0 else [missing for missing in readings if len(missing) == fewest]


def layer_count_key(settings: dict[str, Any]) -> str:
    """The key counting the layer modules of the checkpoint's model family (``num_layers`` for GPT,
    RegularGPT's ``regular_thickness``: its K shared blocks are its layer files)."""
    name = settings.get("arch") or "gpt"
    return families.family(name).layer_count_key if families.unknown_family(name) is None else "num_layers"


def _read_pipeline(checkpoint_dir: Path, trust: bool, settings: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
    """Per model-parallel rank, ``{sequential.N.key: tensor}`` from the layer files."""
    files: dict[int, dict[int, Path]] = {}
    for path in checkpoint_dir.iterdir():
        match = LAYER_FILE.match(path.name)
        if match:
            files.setdefault(int(match.group(2)), {})[int(match.group(1))] = path
    ranks = sorted(files)
    if ranks != list(range(len(ranks))):
        raise ModelParallelError(
            f"{checkpoint_dir} has layer files for model-parallel ranks {ranks}; ranks 0..{max(ranks)} must all be present"
        )
    indices = sorted(set().union(*files.values()))
    absent = [layer_file_name(index, rank) for rank in ranks for index in indices if index not in files[rank]]
    if absent:
        raise ModelParallelError(f"{checkpoint_dir} is incomplete: {', '.join(absent)} missing (other model-parallel "
                                 "ranks have them); copy the whole checkpoint folder again, or load another iteration")
    layers = settings.get(layer_count_key(settings))
    readings = missing_pipeline_indices(indices, int(layers) if layers else None, bool(settings.get("no_weight_tying")))
    if readings:
        names = " or ".join(", ".join(layer_file_name(index, rank) for rank in ranks for index in missing)
                            for missing in readings)
        raise CheckpointError(f"{checkpoint_dir} is incomplete: {names} missing (it has layer files {indices}); "
                              "copy the whole checkpoint folder again, or load another iteration")
    out = []
    for rank in ranks:
        state: dict[str, torch.Tensor] = {}
        for index in indices:
            tensors = safe_torch_load(files[rank][index], trust=trust)
            if not isinstance(tensors, dict):
                raise CheckpointError(f"{files[rank][index]} does not hold a state dict (found {type(tensors).__name__})")
            state.update({join_key(index, key): value for key, value in _strip_prefix(tensors).items()})
        out.append(state)
    return out


def _read_ranks(checkpoint_dir: Path, trust: bool) -> tuple[dict[str, Any], str, list[dict[str, torch.Tensor]]]:
    """The ``mp_rank_00`` record, the layout, and per model-parallel rank ``{sequential.N.key: tensor}``."""
    mp_files = sorted(
        (int(m.group(1)), p) for p in checkpoint_dir.iterdir() if (m := MP_FILE.match(p.name)) is not None
    )
    numbers = [number for number, _ in mp_files]
    if numbers != list(range(len(numbers))):
        absent = ", ".join(mp_rank_file_name(rank) for rank in range(max(numbers)) if rank not in numbers)
        raise ModelParallelError(f"{checkpoint_dir} is incomplete: {absent} missing (it has mp_rank files {numbers}); "
                                 "copy the whole checkpoint folder again, or load another iteration")
    meta: dict[str, Any] = {}
    if mp_files:
        loaded = safe_torch_load(mp_files[0][1], trust=trust)
        meta = loaded if isinstance(loaded, dict) else {}
    if any(LAYER_FILE.match(p.name) for p in checkpoint_dir.iterdir()):
        args = {key: value for key, value in plain_args(meta.get("args")).items() if value is not None}
        settings = read_config_files(checkpoint_dir) | args
        return meta, "pipeline", _read_pipeline(checkpoint_dir, trust, settings)
    if not isinstance(meta.get("module"), dict):
        found = mp_rank_file_name(0) if mp_files else "no mp_rank_00_model_states.pt"
        raise CheckpointError(
            f"{checkpoint_dir} is not a complete checkpoint: it has no layer_*-model_*-model_states.pt files and "
            f"{found} holds no 'module' state dict; copy the whole checkpoint folder again, or load another iteration"
        )
    ranks = [_strip_prefix(meta["module"])]
    for _, path in mp_files[1:]:
        other = safe_torch_load(path, trust=trust)
        if not isinstance(other, dict) or not isinstance(other.get("module"), dict):
            raise CheckpointError(f"{path} has no 'module' state dict, unlike mp_rank_00")
        ranks.append(_strip_prefix(other["module"]))
    return meta, "sequential", ranks


def read_checkpoint(
    load_dir: str | Path, iteration: int | None = None, *, trust: bool = False, num_heads: int | None = None
) -> LoadedCheckpoint:
    """Read a GPT-NeoX/KERPLE (or this project's) checkpoint and merge its model-parallel ranks.

    ``num_heads`` is used when the checkpoint's ``args`` lack ``num_attention_heads`` (needed to
    merge per-head positional tensors).
    """
    checkpoint_dir = checkpoint_to_read(load_dir, iteration)
    meta, layout, ranks = _read_ranks(checkpoint_dir, trust)
    args = plain_args(meta.get("args"))
    declared = args.get("model_parallel_size")
    if declared is not None and int(declared) != len(ranks):
        raise ModelParallelError(
            f"{checkpoint_dir}: args.model_parallel_size is {declared} but the {layout} files hold {len(ranks)} "
            "model-parallel rank(s); the checkpoint is incomplete"
        )
    for rank, state in enumerate(ranks):
        check_shared_positional(state, f"{checkpoint_dir} (model-parallel rank {rank})")
    config = read_config_files(checkpoint_dir)
    heads = args.get("num_attention_heads") or config.get("num_attention_heads") or num_heads
    if len(ranks) > 1 and not heads:
        raise ModelParallelError(
            f"{checkpoint_dir}: cannot merge {len(ranks)} model-parallel ranks without num_attention_heads "
            "(not in args or configs/); pass it from the config"
        )
    embedding = ranks[0].get(join_key(0, WORD_EMBEDDINGS))
    hidden = int(embedding.shape[1]) if embedding is not None else int(args.get("hidden_size", 0))
    state = merge_model_parallel(ranks, ShardSpec(num_heads=int(heads or 0), hidden_size=hidden))
    NeoxAdapter.for_reference(state).check_indices(state, checkpoint_dir)
    step = meta.get("iteration", meta.get("global_steps"))
    if step is None:
        step = trailing_step(checkpoint_dir.name) or 0
    pos_emb = args.get("pos_emb", config.get("pos_emb"))
    if pos_emb is None:
        # a saved reference config without pos-emb means its default; else read the tensors
        pos_emb = "learned" if config else infer_pos_emb(state)
    return LoadedCheckpoint(
        path=checkpoint_dir,
        iteration=int(step),
        layout=layout,
        model_parallel_size=len(ranks),
        state_dict=state,
        args=args,
        config=config,
        pos_emb=canonical_pos_emb(pos_emb),
        meta={k: v for k, v in meta.items() if k not in ("module", "optimizer")},
        is_kerple_format="kerple_checkpoint_format" in meta,
    )
