"""Long-context retrieval (thesis chapter 5): passkey retrieval (Mohtashami & Jaggi 2023) and line
retrieval (Li et al. 2023), with prompts built deterministically from a seed.

A prompt is a token sequence: an instruction, filler, the needle at a relative depth of the
filler (0 = first, 1 = last), then the question; the answer's tokens follow the question. Pieces
are tokenized separately and concatenated, so the key's tokens in the needle are exactly the
answer's tokens, and the key occurs once in the prompt. Each prompt plus its answer fits in the
stated length. Greedy decoding of ``len(answer)`` tokens scores 1 when it reproduces the answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from kerple.analysis.errors import AnalysisError
from kerple.progress import progress_bar

TASKS = ("passkey", "line")
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                 "I will quiz you about the important information there.")
PASSKEY_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
LINE_INTRO = "Below is a record of lines I want you to remember. Each line begins with 'line <line index>'."

Encode = Callable[[str], list[int]]


@dataclass(frozen=True)
class Prompt:
    """One retrieval sample: ``tokens`` (the prompt), ``answer`` (the tokens to generate),
    ``key`` (the answer's text), ``depth`` and ``needle_start`` (token index of the needle)."""

    tokens: list[int]
    answer: list[int]
    key: str
    depth: float
    needle_start: int


def filler_units_before(depth: float, units: int) -> int:
    """How many of ``units`` filler units precede a needle at relative ``depth``."""
    return int(round(depth * units))


def passkey_prompt(encode: Encode, length: int, depth: float, rng: random.Random) -> Prompt:
    """Mohtashami & Jaggi's passkey prompt of at most ``length`` tokens (answer included)."""
    key = str(rng.randint(10000, 99999))
    intro, unit = encode(PASSKEY_INTRO), encode(PASSKEY_FILLER)
    key_tokens = encode(" " + key)
    needle = encode(" The pass key is") + key_tokens + encode(". Remember it.")
    question = encode(" What is the pass key? The pass key is")
    budget = length - len(intro) - len(needle) - len(question) - len(key_tokens)
    units = budget // len(unit)
    if units < 1:
        raise AnalysisError(f"--lengths: {length} tokens cannot hold a passkey prompt; use at least "
                            f"{length - budget + len(unit)}")
    before = filler_units_before(depth, units)
    head = intro + unit * before
    tokens = head + needle + unit * (units - before) + question
    return Prompt(tokens, key_tokens, key, depth, len(head))


def line_prompt(encode: Encode, length: int, depth: float, rng: random.Random) -> Prompt:
    """Li et al.'s line retrieval: ``line <label>: REGISTER_CONTENT is <value>`` lines; the question
    asks for the value of the line at ``depth``. Labels and values are distinct, so the key occurs once."""
    intro = encode(LINE_INTRO)
    labels = rng.sample(range(100, 1000), 900)
    values = rng.sample(range(10000, 100000), 900)
    lines = [encode(f"\nline {labels[i]}: REGISTER_CONTENT is <") + encode(str(values[i])) + encode(">")
             for i in range(min(len(labels), length // 8 + 1))]  # a line takes more than 8 tokens

    def assemble(count: int) -> Prompt:
        target = filler_units_before(depth, count - 1)
        question = encode(f"\nWhat is the REGISTER_CONTENT in line {labels[target]}? REGISTER_CONTENT is <")
        start = len(intro) + sum(len(piece) for piece in lines[:target])
        tokens = intro + [token for piece in lines[:count] for token in piece] + question
        return Prompt(tokens, encode(str(values[target])), str(values[target]), depth, start)

    count = len(lines)
    while count >= 1:
        prompt = assemble(count)
        if len(prompt.tokens) + len(prompt.answer) <= length:
            return prompt
        count -= 1
    raise AnalysisError(f"--lengths: {length} tokens cannot hold a line-retrieval prompt")


BUILDERS: dict[str, Callable[[Encode, int, float, random.Random], Prompt]] = {
    "passkey": passkey_prompt, "line": line_prompt,
}


def build_prompts(task: str, encode: Encode, lengths: Sequence[int], depths: Sequence[float],
                  num_samples: int, seed: int) -> list[tuple[int, Prompt]]:
    """``num_samples`` prompts per (length, depth), the same for the same seed: ``[(length, prompt)]``."""
    if task not in BUILDERS:
        raise AnalysisError(f"--task {task!r}: choose one of {', '.join(TASKS)}")
    prompts = []
    for length in lengths:
        for depth in depths:
            rng = random.Random(f"{seed}/{task}/{length}/{depth}")
            prompts += [(length, BUILDERS[task](encode, length, depth, rng)) for _ in range(num_samples)]
    return prompts


@torch.no_grad()
def greedy_answer(model: Callable[..., torch.Tensor], prompt: Prompt, device: torch.device,
                  vocab_limit: int | None = None) -> list[int]:
    """Greedy decoding of ``len(prompt.answer)`` tokens after the prompt.

    A model with ``new_cache()`` (:class:`~kerple.model.GPTModel`) reads the prompt once and then
    one token per step through its KV cache (no new kernel shape per step); any other
    ``tokens [1, s] -> logits [1, s, V]`` callable gets the whole sequence at every step.
    """
    tokens = torch.tensor([prompt.tokens], dtype=torch.long, device=device)
    cache = model.new_cache() if hasattr(model, "new_cache") else None
    generated: list[int] = []
    step_input = tokens
    for _ in prompt.answer:
        logits = (model(step_input) if cache is None else model(step_input, cache=cache))[0, -1]
        if vocab_limit is not None:
            logits = logits[:vocab_limit]
        generated.append(int(logits.argmax()))
        following = tokens.new_tensor([[generated[-1]]])
        step_input = torch.cat([step_input, following], dim=1) if cache is None else following
    return generated


def accuracy(model: Callable[..., torch.Tensor], prompts: list[tuple[int, Prompt]], device: torch.device,
             vocab_limit: int | None = None, progress: bool = True, desc: str = "retrieval") -> dict[str, Any]:
    """Exact-match accuracy per length and per (length, depth)."""
    hits: dict[int, dict[float, list[int]]] = {}
    for length, prompt in progress_bar(prompts, desc=desc, disable=not progress):
        correct = greedy_answer(model, prompt, device, vocab_limit) == prompt.answer
        hits.setdefault(length, {}).setdefault(prompt.depth, []).append(int(correct))
    by_depth = {str(length): {f"{depth:g}": sum(v) / len(v) for depth, v in depths.items()}
                for length, depths in hits.items()}
    overall = {str(length): sum(sum(v) for v in depths.values()) / sum(len(v) for v in depths.values())
               for length, depths in hits.items()}
    return {"accuracy": overall, "accuracy_by_depth": by_depth}


def plot_heatmaps(runs: dict[str, dict[str, Any]], title: str) -> Any:
    """Accuracy as a (depth × length) heat map, one panel per temperature setting."""
    from kerple.analysis.common import pyplot

    plt = pyplot()
    figure, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.6), squeeze=False, layout="constrained")
    for axis, (label, run) in zip(axes[0], runs.items()):
        lengths = list(run["accuracy_by_depth"])
        depths = list(run["accuracy_by_depth"][lengths[0]])
        grid = [[run["accuracy_by_depth"][length][depth] for length in lengths] for depth in depths]
        image = axis.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
        axis.set_xticks(range(len(lengths)), lengths)
        axis.set_yticks(range(len(depths)), depths)
        axis.set_xlabel("length (tokens)")
        axis.set_ylabel("needle depth (0 = start, 1 = end)" if axis is axes[0][0] else "")
        axis.set_title(f"τ = {label}", fontsize=9)
    figure.colorbar(image, ax=axes[0].tolist(), label="accuracy (exact match)")
    figure.suptitle(title)
    return figure
