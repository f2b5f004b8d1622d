"""Length generalization on regular languages (thesis §6.4.2, Table 6.1): train, test, summarise.

Each run trains one model on lengths ``1..train_max_length`` (a fresh batch per step, its length
drawn uniformly, as in Deletang et al.) and measures the accuracy of the answer read at the final
position on every test length. Models: ``regulargpt`` (:class:`~kerple.model.regular.RegularGPT`),
``transformer`` (:class:`~kerple.model.GPTModel` with a relative embedding from the registry) and
``rnn`` (``torch.nn.LSTM``). The classes are the first ``num_classes`` logits of the last position.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kerple.progress import progress_bar
from kerple.regular_languages.settings import ARCH_NAMES, STOP_WINDOW, RunSettings
from kerple.regular_languages.tasks import Task, TaskError, sample_batch
from kerple.regular_languages.thesis import TABLE_6_1, thesis_column




class LSTMClassifier(nn.Module):
    """``torch.nn.LSTM`` over embedded symbols, a linear readout of every position."""

    def __init__(self, vocab: int, hidden_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden_size)
        self.lstm = nn.LSTM(hidden_size, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embedding(tokens))[0])  # [b, T, vocab]


def regular_gpt(task: Task, settings: RunSettings) -> nn.Module:
    """RegularGPT (thesis ch. 6) with the run's chunk size, thickness and padding."""
    from kerple.model.regular import RegularGPT

    return RegularGPT(
        chunk_size=settings.chunk_size, thickness=settings.thickness, hidden_size=settings.hidden_size,
        num_attention_heads=settings.num_heads, padded_vocab_size=classifier_vocab(task), padding=settings.padding,
    )


def transformer(task: Task, settings: RunSettings) -> nn.Module:
    """A GPT-NeoX decoder of ``transformer_layers`` layers with a relative embedding from the registry."""
    from kerple import positional
    from kerple.model import GPTModel

    embedding = positional.build(
        settings.pos_emb, num_heads=settings.num_heads, head_dim=settings.hidden_size // settings.num_heads,
        hidden_size=settings.hidden_size, max_positions=task.train_max_length,
        num_layers=settings.transformer_layers,
    )
    return GPTModel(
        num_layers=settings.transformer_layers, hidden_size=settings.hidden_size,
        num_attention_heads=settings.num_heads, padded_vocab_size=classifier_vocab(task), positional=embedding,
        hidden_dropout=0.0, attention_dropout=0.0, attention_impl="auto", flex_compile=False,
    )


def lstm(task: Task, settings: RunSettings) -> nn.Module:
    """``torch.nn.LSTM`` of width ``hidden_size``."""
    return LSTMClassifier(classifier_vocab(task), settings.hidden_size)


CLASSIFIERS: dict[str, Callable[[Task, RunSettings], nn.Module]] = dict(zip(ARCH_NAMES, (regular_gpt, transformer, lstm)))
ARCHS: tuple[str, ...] = ARCH_NAMES


def classifier_vocab(task: Task) -> int:
    """Output rows: the symbols are read in, the classes read out of the same rows."""
    return max(task.num_symbols, task.num_classes)


def build_classifier(arch: str, task: Task, settings: RunSettings) -> nn.Module:
    """A model whose ``forward(tokens [b, T])`` returns ``[b, T, V]`` with ``V >= num_classes``."""
    if arch not in CLASSIFIERS:
        raise TaskError(f"unknown --arch {arch!r}; choose one of {', '.join(ARCHS)}")
    return CLASSIFIERS[arch](task, settings)


def final_logits(model: nn.Module, tokens: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class logits ``[b, num_classes]`` read at the final position."""
    return model(tokens)[:, -1, :num_classes]


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The fraction of the learning rate used at ``step`` (from 0): a linear warm-up over
    ``warmup_steps`` steps (the first step uses ``1 / warmup_steps``), then 1."""
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def train(model: nn.Module, task: Task, settings: RunSettings, rng: np.random.Generator, progress: bool) -> list[float]:
    """Up to ``settings.steps`` Adam steps on lengths drawn uniformly from ``1..train_max_length``,
    the learning rate warmed up linearly over ``settings.warmup_steps``, stopping early once the
    training loss is below ``settings.stop_loss``; the losses."""
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_factor(step, settings.warmup_steps))
    model.train()
    losses = []
    for _ in progress_bar(range(settings.steps), desc=f"train {task.name}", disable=not progress, leave=False):
        length = int(rng.integers(1, task.train_max_length + 1))
        inputs, labels = sample_batch(task, length, settings.batch_size, rng, settings.probability)
        loss = F.cross_entropy(final_logits(model, torch.from_numpy(inputs), task.num_classes), torch.from_numpy(labels))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if settings.stop_loss and len(losses) >= STOP_WINDOW and np.mean(losses[-STOP_WINDOW:]) < settings.stop_loss:
            break
    return losses


@torch.no_grad()
def accuracy_by_length(
    model: nn.Module, task: Task, lengths: list[int], settings: RunSettings, rng: np.random.Generator, progress: bool
) -> dict[int, float]:
    """Accuracy of ``settings.eval_samples`` fresh strings at each length."""
    model.eval()
    accuracy = {}
    for length in progress_bar(lengths, desc=f"test {task.name}", disable=not progress, leave=False):
        inputs, labels = sample_batch(task, length, settings.eval_samples, rng, settings.probability)
        correct = 0
        for start in range(0, len(labels), settings.eval_batch):
            batch = torch.from_numpy(inputs[start : start + settings.eval_batch])
            predicted = final_logits(model, batch, task.num_classes).argmax(-1).numpy()
            correct += int((predicted == labels[start : start + settings.eval_batch]).sum())
        accuracy[length] = correct / len(labels)
    return accuracy


def run(task: Task, arch: str, seed: int, settings: RunSettings, lengths: list[int], progress: bool = False) -> dict[str, Any]:
    """One seed of one model on one task: the JSON record of a result."""
    torch.manual_seed(seed)
    model = build_classifier(arch, task, settings)
    started = time.perf_counter()
    losses = train(model, task, settings, np.random.default_rng([seed, 0]), progress)
    trained = time.perf_counter()
    in_distribution = accuracy_by_length(model, task, [task.train_max_length], settings, np.random.default_rng([seed, 2]), False)
    accuracy = accuracy_by_length(model, task, lengths, settings, np.random.default_rng([seed, 1]), progress)
    return {
        "task": task.name,
        "arch": arch,
        "seed": seed,
        "train_max_length": task.train_max_length,
        "accuracy": {str(length): value for length, value in accuracy.items()},
        "mean_accuracy": float(np.mean(list(accuracy.values()))),
        "train_length_accuracy": in_distribution[task.train_max_length],
        "final_loss": float(np.mean(losses[-50:])),
        "steps": len(losses),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": trained - started,
        "test_seconds": time.perf_counter() - trained,
        "settings": asdict(settings),
    }


def summary_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table 6.1's Max/Avg over seeds of ``mean_accuracy`` (in %), one row per (task, arch), with
    the thesis' numbers for the same column where it has one."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in results:
        groups.setdefault((record["task"], record["arch"]), []).append(record)
    rows = []
    for (task, arch), records in groups.items():
        values = [100.0 * record["mean_accuracy"] for record in records]
        column = thesis_column(arch, int(records[0]["settings"]["chunk_size"]))
        rows.append({
            "task": task, "arch": arch, "seeds": len(values), "max": max(values), "avg": float(np.mean(values)),
            "thesis": TABLE_6_1.get(task, {}).get(column) if column else None,
            "pos_emb": records[0]["settings"].get("pos_emb") if arch == "transformer" else None,
        })
    return rows


def _headers(arch: str, rows: list[dict[str, Any]]) -> str:
    """The two column headers of ``arch``: the transformer's name its embedding, and the thesis' baseline
    its own (Transformer-XL's relative positions), which the table's numbers come from."""
    if arch != "transformer":
        return f"{arch}: ours Max / Avg (seeds) | {arch}: thesis"
    embeddings = sorted({str(row.get("pos_emb")) for row in rows if row["arch"] == arch and row.get("pos_emb")})
    ours = f"transformer ({', '.join(embeddings)})" if embeddings else "transformer"
    return f"{ours}: ours Max / Avg (seeds) | transformer (Transformer-XL positions): thesis"


def summary_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table: one row per task; per model, ``Max / Avg (seeds)`` and the thesis' Max / Avg."""
    archs = list(dict.fromkeys(row["arch"] for row in rows))
    tasks = list(dict.fromkeys(row["task"] for row in rows))
    cells = {(row["task"], row["arch"]): row for row in rows}
    header = "| task | " + " | ".join(_headers(arch, rows) for arch in archs) + " |"
    lines = [header, "|---" * (2 * len(archs) + 1) + "|"]
    for task in tasks:
        parts = []
        for arch in archs:
            row = cells.get((task, arch))
            ours = "-" if row is None else f"{row['max']:.1f} / {row['avg']:.1f} ({row['seeds']})"
            thesis = row and row.get("thesis")
            parts += [ours, f"{thesis[0]:.1f} / {thesis[1]:.1f}" if thesis else "-"]
        lines.append(f"| {task} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


PLOT_COLUMNS = 4
"""Panels per row of :func:`plot_accuracy` (Table 6.1's twelve tasks: three rows)."""


def plot_accuracy(results: list[dict[str, Any]], path: str) -> None:
    """Accuracy against test length, one panel per task, the seed mean per model (min-max shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in results))
    columns = min(len(tasks), PLOT_COLUMNS)
    rows = -(-len(tasks) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
    for ax in axes.flat[len(tasks):]:
        ax.set_visible(False)
    for ax, task in zip(axes.flat, tasks):
        for arch in dict.fromkeys(r["arch"] for r in results if r["task"] == task):
            runs = [r for r in results if r["task"] == task and r["arch"] == arch]
            lengths = [int(n) for n in runs[0]["accuracy"]]
            values = np.array([[r["accuracy"][str(n)] for n in lengths] for r in runs])
            ax.plot(lengths, values.mean(0), label=f"{arch} ({len(runs)} seeds)", linewidth=1)
            ax.fill_between(lengths, values.min(0), values.max(0), alpha=0.2)
        ax.set_title(f"{task} (trained on 1..{runs[0]['train_max_length']})", fontsize=9)
        ax.set_xlabel("test length")
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
