"""What a checkpoint records besides tensors: architecture args and RNG states (docs/reference-format.md §6).

RNG states are stored in a form ``torch.load(weights_only=True)`` accepts: NumPy's state tuple is
kept under the reference's key ``np_rng_state`` but as a dict of a tensor and plain numbers.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kerple.checkpoint.errors import ArchitectureMismatchError
from kerple.checkpoint.writer import REFERENCE_ARGS  # the reference's ``args`` keys (docs/reference-format.md §6)

# Fields that change parameter shapes or what the weights mean; a resume must match all of them.
ARCHITECTURE_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "padded_vocab_size",
    "pos_emb",
    "norm",
    "activation",
    "gpt_j_residual",
    "no_weight_tying",
    "model_parallel_size",
)


def _plain(value: Any) -> Any:
    """Config values as plain Python types (safe for ``weights_only`` loading)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def architecture_args(cfg: Any) -> dict[str, Any]:
    """The ``args`` dict stored in ``mp_rank_MM_model_states.pt``."""
    model, sources = cfg.model, (cfg.model, cfg.data, cfg.parallelism, cfg.positional)
    args: dict[str, Any] = {}
    for name in REFERENCE_ARGS + ARCHITECTURE_FIELDS + ("seq_length",):
        for section in sources:
            if hasattr(section, name):
                args[name] = _plain(getattr(section, name))
                break
    args["pos_emb"] = _plain(cfg.positional.pos_emb)
    options = cfg.positional.options() if hasattr(cfg.positional, "options") else {}
    args["positional_options"] = _plain(dict(options))
    args.setdefault("max_position_embeddings", _plain(getattr(model, "max_position_embeddings", None)))
    return args


def check_architecture(
    saved: dict[str, Any] | None, current: dict[str, Any], source: Path | str, *, ignore: tuple[str, ...] = ()
) -> None:
    """Raise :class:`ArchitectureMismatchError` naming every field that differs (except ``ignore``)."""
    if not saved:
        return
    fields = [name for name in list(ARCHITECTURE_FIELDS) + ["positional_options"] if name not in ignore]
    diffs = [
        f"{name}: checkpoint {saved.get(name)!r} vs config {current.get(name)!r}"
        for name in fields
        if name in saved and name in current and saved.get(name) != current.get(name)
    ]
    if diffs:
        raise ArchitectureMismatchError(
            f"checkpoint {source} was trained with a different architecture: {'; '.join(diffs)}. "
            "Resume with the config the checkpoint was saved with (it is in its configs/ folder)."
        )


def capture_rng() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA) generator states, under the reference's key names."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "random_rng_state": random.getstate(),
        "np_rng_state": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "rng_tracker_states": None,
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng`; absent entries are left alone."""
    if state.get("random_rng_state") is not None:
        version, internal, gauss = state["random_rng_state"]
        random.setstate((version, tuple(internal), gauss))
    np_state = state.get("np_rng_state")
    if isinstance(np_state, dict):
        np.random.set_state(
            (
                np_state["name"],
                np_state["keys"].numpy().astype(np.uint32),
                np_state["pos"],
                np_state["has_gauss"],
                np_state["cached_gaussian"],
            )
        )
    if state.get("torch_rng_state") is not None:
        torch.set_rng_state(state["torch_rng_state"])
    if state.get("cuda_rng_state") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng_state"])
