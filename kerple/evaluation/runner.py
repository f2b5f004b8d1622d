"""Extrapolation evaluation: run a model over the windows of a protocol and collect losses.

The split's documents are concatenated in their stored order into one token stream (the
reference instead draws its windows from a shuffled ``GPT2Dataset`` at each length; a fixed stream
lets every length score the *same* tokens, which the paired comparison of §5.2 wants).
Losses are summed in float64; ``ppl = exp(mean loss over scored tokens)``. A run trained with
``eod_mask_loss`` is scored as the reference's evaluation scores it: the token after an end-of-document
token is not scored (the same stream positions at every length).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kerple.evaluation.errors import EvaluationError
from kerple.evaluation.protocols import WindowPlan
from kerple.progress import progress_bar

# (tokens [b, n], labels [b, n], first) -> per-token loss [b, n - first] of positions first .. n - 1
LossFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]

SPLITS = ("train", "valid", "test")
LOGIT_CHUNK_BYTES = 256 * 2**20  # budget for one chunk of fp32 logits in chunked_loss
MEMORY_HEADROOM = 0.9  # refuse when the estimate exceeds this fraction of the free memory


@dataclass
class LengthResult:
    """The outcome at one evaluation length, as written to ``results.json``."""

    length: int
    input_length: int
    loss: float
    ppl: float
    num_windows: int
    scored_tokens: int
    batch_size: int
    seconds: float
    per_position_loss: list[float | None] | None = None
    per_document: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for optional in ("per_position_loss", "per_document"):
            if doc[optional] is None:
                doc.pop(optional)
        return doc


# --- data -----------------------------------------------------------------------------------


def load_split_stream(cfg: Any, split: str) -> np.ndarray:
    """The documents of ``split`` concatenated in stored order, as int64 ``[n]``.
    See :func:`load_split_documents`."""
    return np.concatenate(load_split_documents(cfg, split))


def load_split_documents(cfg: Any, split: str) -> list[np.ndarray]:
    """The documents of ``split`` in stored order, each as int64 ``[n_i]``.

    ``cfg.data.<split>_data_paths`` when set, otherwise the ``split`` range of ``cfg.data.data_path``
    (the same contiguous document ranges the trainer uses, docs/reference-format.md §7).
    """
    from kerple.data.gpt2_dataset import require_dataset_files, split_boundaries
    from kerple.data.indexed_dataset import MMapIndexedDataset

    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    data = cfg.data
    separate = getattr(data, f"{split}_data_paths", None)
    prefix = split_prefix(cfg, split)
    if separate:
        require_dataset_files(cfg, f"{split}_data_paths", prefix)
        indexed = MMapIndexedDataset(prefix)
        first, last = 0, len(indexed)
    else:
        if not prefix:
            raise EvaluationError(f"the config sets no data_path (nor {split}_data_paths) to evaluate on: add "
                                  f"{split}_data_paths=[PREFIX] or data_path=PREFIX, or name the run's YAML configs "
                                  "with a data one (e.g. configs/data/stdlib.yml)")
        require_dataset_files(cfg, "data_path", prefix)
        indexed = MMapIndexedDataset(prefix)
        bounds = split_boundaries(str(data.split or "969,30,1"), len(indexed))
        position = SPLITS.index(split)
        first, last = bounds[position], bounds[position + 1]
    if last <= first:
        raise EvaluationError(f"split {split!r} of {prefix} holds no documents (split {data.split!r})")
    documents = [np.asarray(indexed[i], dtype=np.int64) for i in range(first, last)]
    largest = max(int(document.max(initial=0)) for document in documents)
    if largest >= cfg.model.padded_vocab_size:
        raise EvaluationError(
            f"the {split} split of {prefix} holds token id {largest}, beyond the model's vocabulary of "
            f"{cfg.model.padded_vocab_size} (vocab_size={cfg.model.vocab_size}, {cfg.provenance('model.vocab_size')[0]}); "
            "use the tokenizer and vocab_size the model was trained with"
        )
    return documents


def split_prefix(cfg: Any, split: str) -> str | None:
    """The indexed dataset ``split`` is read from: ``<split>_data_paths`` when set, else ``data_path``."""
    path = getattr(cfg.data, f"{split}_data_paths", None) or cfg.data.data_path
    return path[0] if isinstance(path, (list, tuple)) else path


def document_names(cfg: Any, split: str, count: int) -> list[str] | None:
    """The names of ``split``'s ``count`` documents (a local source's file keys) from the dataset's
    ``info.json`` (``prepare_data.py`` records the held-out parts'), or ``None`` when it holds none
    for exactly these documents."""
    import json

    separate = getattr(cfg.data, f"{split}_data_paths", None)
    if separate:
        prefix = str(separate[0] if isinstance(separate, (list, tuple)) else separate)
        prefix = prefix.replace(f"_{split}_text_document", "_text_document")  # the combined file's info
    else:
        path = cfg.data.data_path
        prefix = str(path[0] if isinstance(path, (list, tuple)) else path)
    try:
        info = json.loads(Path(f"{prefix}.info.json").read_text())
    except (OSError, ValueError):
        return None
    if not separate and info.get("split") != cfg.data.split:
        return None  # another split string selects other documents
    names = (info.get("documents") or {}).get(split)
    return list(names) if isinstance(names, list) and len(names) == count else None


def dataset_name(cfg: Any) -> str:
    """A short dataset name from the data path: ``data/github/github_text_document`` -> ``github`` (and
    ``data/stdlib/stdlib_valid_text_document``, a separate validation file, -> ``stdlib``)."""
    path = getattr(cfg.data, "valid_data_paths", None) or cfg.data.data_path
    path = path[0] if isinstance(path, (list, tuple)) else path
    return Path(str(path)).name.removesuffix("_text_document").removesuffix("_valid") if path else "unknown"


# --- memory ---------------------------------------------------------------------------------


def estimate_forward_bytes(
    *,
    batch: int,
    length: int,
    hidden: int,
    heads: int,
    vocab: int,
    attention_impl: str,
    logit_chunk: int,
) -> int:
    """Rough peak bytes of one no-grad fp32 forward beyond the weights.

    eager and sdpa materialize ``[b, H, L, L]`` fp32 scores (eager also the softmax output, sdpa
    its float mask) plus the ``[H, L, L]`` bias gathered from the distance tables; ``flex`` and
    ``triton`` keep only O(L) tables. Activations of one layer are ~12 hidden-sized fp32 tensors per token (the
    4h MLP intermediate included), and the loss materializes one chunk of fp32 logits at a time.
    """
    activations = 12 * batch * length * hidden * 4
    if attention_impl in ("flex", "triton"):
        attention = 4 * batch * heads * length * 4
    else:
        attention = 3 * batch * heads * length * length * 4 + heads * length * length * 4
    logits = 3 * batch * min(logit_chunk, length) * vocab * 4
    return activations + attention + logits


def available_bytes(device: torch.device) -> int:
    """Free memory on ``device``: ``cuda.mem_get_info`` on GPUs, available RAM otherwise."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def fit_batch_size(
    wanted: int, estimate: Callable[[int], int], free: int, *, length: int, attention_impl: str
) -> int:
    """Largest batch ``<= wanted`` whose estimate fits ``MEMORY_HEADROOM * free``; refuses if none."""
    batch = wanted
    while batch > 1 and estimate(batch) > MEMORY_HEADROOM * free:
        batch //= 2
    needed = estimate(batch)
    if needed > MEMORY_HEADROOM * free:
        hint = (
            " attention_impl=flex avoids the L×L score matrices." if attention_impl != "flex" else ""
        )
        raise EvaluationError(
            f"length {length} does not fit in memory: one window needs about {needed / 2**30:.1f} GiB "
            f"with attention_impl={attention_impl}, but only {free / 2**30:.1f} GiB is free.{hint}"
        )
    return batch


# --- the evaluation loop --------------------------------------------------------------------


def model_loss_fn(model: nn.Module, logit_chunk_bytes: int = LOGIT_CHUNK_BYTES) -> LossFn:
    """Per-token losses of a ``GPTModel`` for the positions ``first .. n - 1`` of each window.

    Whole windows go through ``GPTModel.chunked_loss`` (never full-length fp32 logits); when only a
    suffix is scored (sliding, last_token) the LM head runs on that suffix alone. Any other module
    mapping tokens to logits also works (full logits, then cross entropy).
    """
    vocab = int(getattr(model, "vocab_size", 0) or 0)

    def loss(tokens: torch.Tensor, labels: torch.Tensor, first: int) -> torch.Tensor:
        chunk = max(1, logit_chunk_bytes // (4 * max(vocab, 1) * tokens.shape[0]))
        if first == 0 and hasattr(model, "chunked_loss"):
            return model.chunked_loss(tokens, labels, chunk_size=chunk).float()
        if hasattr(model, "hidden_states"):
            hidden = model.hidden_states(tokens)[:, first:]  # [b, n - first, h]
            labels = labels[:, first:]
            pieces = []
            for start in range(0, hidden.shape[1], chunk):
                logits = F.linear(hidden[:, start : start + chunk], model.lm_head_weight).float()
                pieces.append(F.cross_entropy(logits.transpose(1, 2), labels[:, start : start + chunk], reduction="none"))
            return torch.cat(pieces, dim=1)
        logits = model(tokens)[:, first:].float()  # [b, n - first, V]
        return F.cross_entropy(logits.transpose(1, 2), labels[:, first:], reduction="none")

    return loss


def cache_window_loss_fn(model: nn.Module, cache_window: int) -> LossFn:
    """Per-token losses when the model decodes each window through a KV cache that keeps only the
    last ``cache_window`` keys/values (thesis §4.9.2: O(W·L) attention instead of O(L²))."""
    from kerple.inference import windowed_cache_losses

    def loss(tokens: torch.Tensor, labels: torch.Tensor, first: int) -> torch.Tensor:
        return windowed_cache_losses(model, tokens, cache_window, labels)[:, first:]

    return loss


def window_tokens(stream: torch.Tensor, plan: WindowPlan, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Input and label tokens ``[b, n]`` of the windows ``index`` of ``plan``."""
    offsets = torch.arange(plan.input_length + 1)
    starts = torch.from_numpy(plan.starts[index])
    rows = stream[starts[:, None] + offsets[None, :]]  # [b, n + 1]
    return rows[:, :-1], rows[:, 1:]


class _Sums:
    """Running loss sums of one plan: in total, per input position and per document (float64)."""

    def __init__(self, input_length: int, documents: torch.Tensor | None) -> None:
        self.positions = torch.arange(input_length)
        self.total = torch.zeros((), dtype=torch.float64)
        self.position_sum = torch.zeros(input_length, dtype=torch.float64)
        self.position_count = torch.zeros(input_length, dtype=torch.float64)
        self.documents = documents
        num_documents = 0 if documents is None else int(documents.max()) + 1
        self.document_sum = torch.zeros(num_documents, dtype=torch.float64)
        self.document_count = torch.zeros(num_documents, dtype=torch.float64)

    def add(
        self, losses: torch.Tensor, score_from: torch.Tensor, starts: torch.Tensor, first: int,
        keep: torch.Tensor | None = None,
    ) -> None:
        """Add ``losses [b, n - first]`` of windows starting at ``starts [b]``, scored from ``score_from [b]``
        where ``keep [b, n - first]`` (when given) is true."""
        scored = self.positions[None, first:] >= score_from[:, None]  # [b, n - first]
        if keep is not None:
            scored = scored & keep
        masked = torch.where(scored, losses, torch.zeros_like(losses))
        self.total += masked.sum()
        self.position_sum[first:] += masked.sum(0)
        self.position_count[first:] += scored.sum(0)
        if self.documents is not None:
            labels_at = starts[:, None] + 1 + self.positions[None, first:]  # [b, n - first]
            owner = self.documents[labels_at][scored]
            size = self.document_sum.numel()
            self.document_sum += torch.bincount(owner, weights=losses[scored], minlength=size)
            self.document_count += torch.bincount(owner, minlength=size).double()

    def mean(self) -> float:
        """The mean loss over the scored tokens so far."""
        return (self.total / self.position_count.sum().clamp(min=1)).item()

    def per_position(self) -> list[float | None]:
        """Mean loss at each input position, ``None`` where no token was scored."""
        means = (self.position_sum / self.position_count.clamp(min=1)).tolist()
        return [m if c > 0 else None for m, c in zip(means, self.position_count.tolist())]


@torch.no_grad()
def evaluate_plan(
    loss_fn: LossFn,
    stream: np.ndarray | torch.Tensor,
    plan: WindowPlan,
    *,
    batch_size: int = 1,
    per_position: bool = False,
    device: torch.device | str = "cpu",
    progress: bool = True,
    document_of: np.ndarray | None = None,
    on_windows: Callable[[int], None] | None = None,
    unscored_after: int | None = None,
) -> LengthResult:
    """Score every window of ``plan``; the mean loss is over exactly the plan's scored tokens, less
    those whose input token is ``unscored_after`` (the EOD of a run with ``eod_mask_loss``).

    With ``per_position`` also the mean loss at each input position ``0 .. input_length - 1``
    (KERPLE §5.5), ``None`` where the protocol scores no token at that position. With
    ``document_of`` (the document index of every stream token) also the loss of each document over
    its scored label tokens (:func:`per_document_table`). ``on_windows(k)`` is called after every
    batch of ``k`` windows (an overall progress bar).
    """
    stream = torch.as_tensor(stream, dtype=torch.long)
    n = plan.input_length
    if plan.num_windows and int(plan.starts.max()) + n + 1 > stream.numel():
        raise EvaluationError(f"length {plan.length}: windows reach past the {stream.numel()}-token stream")
    sums = _Sums(n, None if document_of is None else torch.as_tensor(document_of, dtype=torch.long))
    start_time = time.perf_counter()
    bar = progress_bar(
        total=plan.num_windows, desc=f"eval L={plan.length}", unit="win", disable=not progress, leave=False
    )
    for first in range(0, plan.num_windows, batch_size):
        index = np.arange(first, min(first + batch_size, plan.num_windows))
        tokens, labels = window_tokens(stream, plan, index)
        first = int(plan.score_from[index].min())
        losses = loss_fn(tokens.to(device), labels.to(device), first).double().cpu()  # [b, n - first]
        keep = None if unscored_after is None else tokens[:, first:] != unscored_after
        sums.add(losses, torch.from_numpy(plan.score_from[index]), torch.from_numpy(plan.starts[index]), first, keep)
        if on_windows is not None:
            on_windows(len(index))
        bar.update(len(index))
        bar.set_postfix(loss=f"{sums.mean():.4f}")
    bar.close()
    loss = sums.mean()
    return LengthResult(
        length=plan.length,
        input_length=n,
        loss=loss,
        ppl=math.exp(loss) if loss < 700 else math.inf,
        num_windows=plan.num_windows,
        scored_tokens=int(sums.position_count.sum().item()),
        batch_size=batch_size,
        seconds=time.perf_counter() - start_time,
        per_position_loss=sums.per_position() if per_position else None,
        per_document=None if sums.documents is None else per_document_table(sums.document_sum, sums.document_count),
    )


def unscored_token(cfg: Any) -> int | None:
    """The end-of-document id when the run sets ``eod_mask_loss`` (its label is left unscored, as in
    training), else ``None``."""
    if not cfg.data.eod_mask_loss:
        return None
    from kerple.data.tokenizers import build_tokenizer

    data = cfg.data
    return int(build_tokenizer(data.tokenizer_type, data.vocab_file, data.merge_file, data.tokenizer_file).eod)


def scored_token_count(plan: WindowPlan, stream: np.ndarray, unscored_after: int | None) -> int:
    """The tokens ``plan`` scores on ``stream``: its scored positions less those after ``unscored_after``."""
    if unscored_after is None:
        return plan.scored_tokens
    after = np.concatenate([[0], np.cumsum(np.asarray(stream) == unscored_after)])  # after[i]: matches in stream[:i]
    inputs_from, inputs_to = plan.starts + plan.score_from, plan.starts + plan.input_length
    return plan.scored_tokens - int((after[inputs_to] - after[inputs_from]).sum())


def per_document_table(loss_sum: torch.Tensor, token_count: torch.Tensor) -> list[dict[str, Any]]:
    """``{document, tokens, loss, ppl}`` of every document with scored tokens, most tokens first
    (``document`` counts the split's documents from 0 in stored order)."""
    rows = [
        {"document": index, "tokens": int(count), "loss": total / count, "ppl": math.exp(min(total / count, 700.0))}
        for index, (total, count) in enumerate(zip(loss_sum.tolist(), token_count.tolist()))
        if count > 0
    ]
    return sorted(rows, key=lambda row: (-row["tokens"], row["document"]))


def format_table(results: Sequence[LengthResult]) -> str:
    """A console table: one row per length."""
    header = f"{'length':>8} {'windows':>8} {'scored':>10} {'loss':>9} {'ppl':>11} {'tok/s':>9}"
    lines = [header, "-" * len(header)]
    for r in results:
        speed = r.num_windows * r.input_length / r.seconds if r.seconds > 0 else math.nan
        lines.append(
            f"{r.length:>8} {r.num_windows:>8} {r.scored_tokens:>10} {r.loss:>9.4f} {r.ppl:>11.3f} {speed:>9.0f}"
        )
    return "\n".join(lines)
