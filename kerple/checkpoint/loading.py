"""Load a checkpoint into a :class:`kerple.model.GPTModel`.

:func:`load_into_model` loads a state dict under the model's names and names every missing,
unexpected or mis-shaped key. :func:`load_model_weights` reads any checkpoint
(:func:`kerple.checkpoint.reference.read_checkpoint`), checks it against a config
(:func:`kerple.checkpoint.architecture.check_architecture`), hands a model-parallel rank its
shard, and loads it through the checkpoint's :class:`~kerple.checkpoint.neox_layout.NeoxAdapter`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kerple.checkpoint.architecture import check_architecture, checkpoint_architecture
from kerple.checkpoint.errors import ArchitectureMismatchError
from kerple.checkpoint.reference import read_checkpoint
from kerple.checkpoint.sharding import ShardSpec, split_model_parallel


def load_into_model(model: nn.Module, state: dict[str, torch.Tensor], source: str | Path) -> None:
    """``model.load_state_dict(state)`` (the model's names) after reconciling derived buffers; errors
    name every bad key.

    * ``*.inv_freq`` (rotary / sinusoidal frequencies) are recomputable: if the model has no such
      key it is dropped; if it has one, the stored value must agree to 1% (bf16 checkpoints round
      it) and the model keeps its own exact fp32 value; a checkpoint without them (stock HF
      exports) gets the model's.
    """
    own = model.state_dict()
    state = dict(state)
    for name in list(state):
        if name in own:
            if name.endswith("inv_freq"):
                stored, mine = state[name].float().cpu(), own[name].float().cpu()
                if stored.shape != mine.shape or not torch.allclose(stored, mine, rtol=1e-2, atol=0.0):
                    raise ArchitectureMismatchError(
                        f"checkpoint {source}: {name} (rotary frequencies) differ from the model's; check "
                        "rotary_pct and rotary_emb_base",
                        ["rotary_pct", "rotary_emb_base"],
                    )
                state[name] = own[name]
            continue
        if name.endswith("inv_freq"):
            del state[name]
    for name in own:
        if name.endswith("inv_freq") and name not in state:
            state[name] = own[name]  # derived from the config, not learned
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if state[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")
        if unexpected:
            parts.append(f"not in the model: {', '.join(unexpected[:10])}{' ...' if len(unexpected) > 10 else ''}")
        if shapes:
            parts.append("shape mismatch: " + "; ".join(shapes[:10]))
        raise ArchitectureMismatchError(
            f"checkpoint {source} does not fit the model ({' | '.join(parts)}). Use the model and positional "
            "config the checkpoint was trained with.",
            [],
        )
    model.load_state_dict(state, strict=True)


def warn_unnamed_embedding(path: Path, state: dict[str, torch.Tensor], assumed: str) -> None:
    """Warn that a checkpoint naming no ``pos_emb`` (no ``args`` entry, no ``configs/``) whose tensors
    do not tell the embedding is loaded as the config's ``assumed`` one, and how to confirm it."""
    kerple_keys = any(name.endswith(("rpe.bias_p", "rpe.bias_a")) for name in state)
    why = (
        "kerple_log and kerple_power store the same tensors (bias_p, bias_a)" if kerple_keys
        else "its tensors hold no positional parameters (none, sinusoidal and sandwich store nothing)"
    )
    logging.getLogger(__name__).warning(
        "warning: %s names no positional embedding (no pos_emb in its args, no configs/ folder) and %s: "
        "loaded as the config's pos_emb %s. Confirm it from the run's own YAML (pos-emb), or evaluate under "
        "each candidate pos_emb: the right one gives a far lower perplexity",
        path, why, assumed,
    )


def load_model_weights(
    model: nn.Module,
    load_dir: str | Path,
    iteration: int | None = None,
    *,
    cfg: Any = None,
    trust: bool = False,
    model_parallel_size: int = 1,
    model_parallel_rank: int = 0,
) -> int:
    """Load any GPT-NeoX / KERPLE / kerple checkpoint into ``model``; return its iteration.

    ``load_dir`` is a ``save`` folder (``latest`` or ``iteration`` picks the tag) or a tag folder.
    ``cfg`` (a :class:`kerple.config.Config`) enables the architecture check. With
    ``model_parallel_size > 1`` the merged weights are re-split and this rank's shard is loaded
    (``model`` must then be the rank's tensor-parallel model). ``trust``: see
    :func:`kerple.checkpoint.safe_load.safe_torch_load`.
    """
    ckpt = read_checkpoint(load_dir, iteration, trust=trust, num_heads=model.num_heads)
    if cfg is not None:
        check_architecture(checkpoint_architecture(ckpt), cfg, ckpt.path, model_parallel_size=ckpt.model_parallel_size)
        if ckpt.pos_emb is None:
            warn_unnamed_embedding(ckpt.path, ckpt.state_dict, str(cfg.positional.pos_emb))
    state = ckpt.state_dict
    if model_parallel_size > 1:
        heads = int(ckpt.args.get("num_attention_heads") or model.num_heads)
        hidden = int(model.hidden_size)
        state = split_model_parallel(state, model_parallel_size, ShardSpec(heads, hidden))[model_parallel_rank]
    load_into_model(model, ckpt.model_state(state), ckpt.path)
    return ckpt.iteration
