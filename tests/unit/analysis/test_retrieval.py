"""Passkey and line retrieval prompts (thesis chapter 5) and their scoring."""

from __future__ import annotations

import pytest
import torch

from kerple.analysis.errors import AnalysisError
from kerple.analysis.retrieval import PASSKEY_INTRO, accuracy, build_prompts

VOCAB = 128


def encode(text: str) -> list[int]:
    """Characters as tokens: the key's text can be found in the prompt's text."""
    return [ord(c) for c in text]


def decode(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_passkey_is_in_the_prompt_once_at_its_depth(depth: float) -> None:
    for length, prompt in build_prompts("passkey", encode, [400, 1000], [depth], num_samples=3, seed=7):
        text = decode(prompt.tokens)
        assert text.count(prompt.key) == 1
        assert len(prompt.tokens) + len(prompt.answer) <= length
        assert decode(prompt.answer) == " " + prompt.key
        assert text[prompt.needle_start :].startswith(f" The pass key is {prompt.key}.")
        filler_before = prompt.needle_start - len(PASSKEY_INTRO)
        filler_total = len(text) - len(PASSKEY_INTRO) - len(" The pass key is . Remember it.") - len(prompt.key) \
            - len(" What is the pass key? The pass key is")
        unit = len(" The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.")
        assert abs(filler_before - depth * filler_total) <= unit / 2


def test_prompts_are_deterministic_from_the_seed() -> None:
    first = build_prompts("passkey", encode, [400], [0.5], num_samples=4, seed=1)
    again = build_prompts("passkey", encode, [400], [0.5], num_samples=4, seed=1)
    other = build_prompts("passkey", encode, [400], [0.5], num_samples=4, seed=2)
    assert [p.tokens for _, p in first] == [p.tokens for _, p in again]
    assert [p.key for _, p in first] != [p.key for _, p in other]


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_line_retrieval_asks_for_one_line_at_its_depth(depth: float) -> None:
    for length, prompt in build_prompts("line", encode, [600], [depth], num_samples=2, seed=3):
        text = decode(prompt.tokens)
        assert text.count(prompt.key) == 1
        assert len(prompt.tokens) + len(prompt.answer) <= length
        lines = [line for line in text.split("\n") if line.startswith("line ")]
        target = text[prompt.needle_start :].split("\n")[1]
        assert target.endswith(f"<{prompt.key}>")
        label = target.split(":")[0]
        assert text.rstrip().split("\n")[-1].startswith(f"What is the REGISTER_CONTENT in {label}?")
        assert lines.index(target) == round(depth * (len(lines) - 1))


def copying_model(tokens: torch.Tensor) -> torch.Tensor:
    """An induction head: predict the token that followed the longest earlier match of the current suffix."""
    sequence = tokens[0].tolist()
    best, prediction = 0, 0
    for end in range(len(sequence) - 1):  # the earlier match ends at ``end``; the next token follows it
        size = 0
        while size <= end and sequence[end - size] == sequence[len(sequence) - 1 - size]:
            size += 1
        if size > best:
            best, prediction = size, sequence[end + 1]
    logits = torch.zeros(1, len(sequence), VOCAB + 5)
    logits[0, -1, prediction] = 1.0
    return logits


def test_a_copying_model_scores_one_and_a_blind_model_zero() -> None:
    prompts = build_prompts("passkey", encode, [350, 600], [0.0, 0.5, 1.0], num_samples=2, seed=0)
    result = accuracy(copying_model, prompts, torch.device("cpu"), vocab_limit=VOCAB, progress=False)
    assert result["accuracy"] == {"350": 1.0, "600": 1.0}
    assert result["accuracy_by_depth"]["600"] == {"0": 1.0, "0.5": 1.0, "1": 1.0}
    blind = accuracy(lambda t: torch.zeros(1, t.shape[1], VOCAB), prompts, torch.device("cpu"), progress=False)
    assert blind["accuracy"] == {"350": 0.0, "600": 0.0}


def test_too_short_a_length_is_refused() -> None:
    with pytest.raises(AnalysisError, match="cannot hold a passkey prompt"):
        build_prompts("passkey", encode, [100], [0.5], num_samples=1, seed=0)


def test_cached_decoding_of_a_model_equals_full_forwards() -> None:
    """A GPTModel decodes through its KV cache; the answer equals decoding with whole-sequence forwards."""
    from tests.unit.model.model_helpers import VOCAB as MODEL_VOCAB, tiny_model

    from kerple.analysis.retrieval import Prompt, greedy_answer

    model = tiny_model("alibi", init_method_std=0.3).eval()
    prompt = Prompt(tokens=list(range(5, 45)), answer=[1, 2, 3, 4, 5], key="", depth=0.0, needle_start=0)
    cached = greedy_answer(model, prompt, torch.device("cpu"))
    full = greedy_answer(lambda tokens: model(tokens), prompt, torch.device("cpu"))
    assert cached == full and all(0 <= t < MODEL_VOCAB for t in cached)


def test_heat_map_labels_say_what_depth_and_colour_mean() -> None:
    from kerple.analysis.retrieval import plot_heatmaps

    run = {"accuracy_by_depth": {"128": {"0": 0.0, "1": 1.0}, "256": {"0": 0.5, "1": 0.0}}}
    figure = plot_heatmaps({"1": run, "log": run}, "passkey")
    assert figure.axes[0].get_ylabel() == "needle depth (0 = start, 1 = end)"
    assert figure.axes[0].get_xlabel() == "length (tokens)"
    assert figure.axes[-1].get_ylabel() == "accuracy (exact match)"  # the colour bar
    assert figure.get_layout_engine() is not None  # the panel titles do not run into the figure's title
