"""Text generation with KV-cached incremental decoding (``generate.py``).

    python generate.py configs/models/162M.yml configs/pe/kerple_log.yml --load checkpoints/run \\
        --prompt "The kernel" --max-new-tokens 64 --temperature 0.8 --top-p 0.9 --cache-window 2048

Each step feeds only the newest token; keys/values of earlier tokens come from a
:class:`kerple.model.KVCache`, and the positional term of the one new query row is read from the
embedding's distance tables (``[H, k_len]``), never a rebuilt ``L×L`` matrix. ``--cache-window W``
keeps the last W keys/values (thesis §4.9.2). Temperature 0 is greedy decoding.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from kerple.config import load_config, parse_overrides, split_arguments
from kerple.errors import KerpleError, entry_point
from kerple.positional.base import PositionKind


class GenerationError(KerpleError):
    """The generation asked for cannot run (prompt, length or cache window); the message says why."""


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids ``[b]`` from last-position logits ``[b, V]``.

    ``temperature == 0``: argmax. Otherwise softmax(logits / T) restricted to the ``top_k`` most
    likely tokens and to the smallest set whose probability reaches ``top_p`` (nucleus).
    """
    logits = logits.float()
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [b, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly better tokens
        drop_sorted = mass_before >= top_p  # keeps the first token that reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _check_length(model: nn.Module, total: int) -> None:
    positional = model.positional
    if positional.kind == PositionKind.INPUT and positional.learnable:
        if total > positional.max_positions:
            raise GenerationError(
                f"cannot generate {total} positions with a learned position table of {positional.max_positions} rows"
            )


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    cache_window: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    vocab_limit: int | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """Continue ``prompt [b, s]`` (int64) by up to ``max_new_tokens``; returns ``[b, s + n]``.

    ``use_cache=False`` recomputes the whole sequence every step (the slow reference path, with
    ``attention_window = cache_window`` so both paths compute the same function).
    ``vocab_limit`` masks the padded vocabulary rows (ids >= the tokenizer's size).
    Generation stops early once every row has produced ``eos_token_id``.
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be [batch, length >= 1], got {tuple(prompt.shape)}")
    _check_length(model, prompt.shape[1] + max_new_tokens)
    model.eval()
    sequence = prompt
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    saved_window = model.attention_window
    cache = model.new_cache(window=cache_window) if use_cache else None
    try:
        if not use_cache and cache_window is not None:
            model.set_attention(window=cache_window if saved_window is None else min(saved_window, cache_window))
        logits = model(prompt, cache=cache)[:, -1] if use_cache else model(prompt)[:, -1]
        for _ in range(max_new_tokens):
            if vocab_limit is not None and vocab_limit < logits.shape[-1]:
                logits[:, vocab_limit:] = float("-inf")
            token = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
            if eos_token_id is not None:
                token = torch.where(finished, torch.full_like(token, eos_token_id), token)
                finished |= token == eos_token_id
            sequence = torch.cat([sequence, token[:, None]], dim=1)
            if eos_token_id is not None and bool(finished.all()):
                break
            if use_cache:
                logits = model(token[:, None], cache=cache)[:, -1]  # one new query row
            else:
                logits = model(sequence)[:, -1]
    finally:
        if not use_cache and cache_window is not None:
            model.set_attention(window=saved_window)
    return sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="generate.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configs", nargs="*",
                        help="YAML config files merged in order, then key=value overrides "
                             "(none: the checkpoint's configs/ folder)")
    parser.add_argument("--load", required=True, help="checkpoint directory (kerple, GPT-NeoX/KERPLE, or a HF export)")
    parser.add_argument("--iteration", type=int, help="checkpoint iteration (default: the 'latest' tag)")
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, help="nucleus sampling mass")
    parser.add_argument("--cache-window", type=int, help="keep only the last W keys/values (thesis §4.9.2)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow pickles that may run code (trusted files only)")
    return parser


def load_any(model: nn.Module, path: str | Path, iteration: int | None, cfg: Any, trust: bool) -> int:
    """Load a Hugging Face export (``config.json`` + ``model.safetensors``) or any checkpoint directory."""
    folder = Path(path)
    if (folder / "model.safetensors").is_file():
        from kerple.checkpoint import check_architecture, load_into_model, state_architecture
        from kerple.checkpoint.huggingface import import_huggingface

        state, exported = import_huggingface(folder)
        check_architecture(state_architecture(state, exported, exported.get("pos_emb")), cfg, folder)
        load_into_model(model, state, folder)
        return 0
    from kerple.checkpoint.loading import load_model_weights

    return load_model_weights(model, folder, iteration, cfg=cfg, trust=trust)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse sampling settings that cannot mean anything (``GenerationError`` naming the flag)."""
    checks = (
        ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens is not None and args.max_new_tokens < 1,
         "an integer of at least 1"),
        ("--temperature", args.temperature, not args.temperature >= 0, "a number >= 0 (0 = greedy)"),
        ("--top-p", args.top_p, args.top_p is not None and not 0 < args.top_p <= 1, "a number in (0, 1]"),
        ("--top-k", args.top_k, args.top_k is not None and args.top_k < 0, "an integer >= 0 (0 = no limit)"),
        ("--cache-window", args.cache_window, args.cache_window is not None and args.cache_window < 1,
         "an integer of at least 1 (keys kept)"),
        ("--iteration", args.iteration, args.iteration is not None and args.iteration < 0, "an integer >= 0"),
    )
    for flag, value, bad, expected in checks:
        if bad:
            raise GenerationError(f"{flag} {value}: expected {expected}")


def generation_config(args: argparse.Namespace) -> Any:
    """The run's config: the YAML files and overrides given, else the checkpoint's ``configs/``."""
    yamls, overrides = split_arguments(args.configs)
    if not yamls and not (Path(args.load) / "model.safetensors").is_file():
        from kerple.checkpoint.files import checkpoint_config_files

        yamls = checkpoint_config_files(args.load, args.iteration)
        print(f"config: {', '.join(yamls)} (from the checkpoint)", file=sys.stderr)
    elif not yamls:
        raise GenerationError(f"{args.load} is a Hugging Face export: name the run's YAML configs on the command line")
    return load_config(yamls, parse_overrides(overrides))


def run(args: argparse.Namespace) -> str:
    """Check the flags, load config, tokenizer and weights; return the generated text (prompt included)."""
    from kerple.data.tokenizers import build_tokenizer
    from kerple.model import build_model

    check_arguments(args)
    cfg = generation_config(args)
    data = cfg.data
    regular = cfg.model.arch == "regulargpt"  # no KV cache: its depth changes with the length (thesis §6.2.2)
    if regular and args.cache_window is not None:
        raise GenerationError("--cache-window: RegularGPT (arch regulargpt) has no KV cache; drop the option")
    # The tokenizer first: a bad tokenizer file fails in a second, before the weights are read.
    tokenizer = build_tokenizer(data.tokenizer_type, data.vocab_file, data.merge_file, data.tokenizer_file)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = build_model(cfg, flex_compile=False)
    iteration = load_any(model, args.load, args.iteration, cfg, args.trust_checkpoint)
    print(f"loaded {args.load} at iteration {iteration}", file=sys.stderr)
    model.to(device).eval()
    ids = tokenizer.tokenize(args.prompt)
    if not ids:
        raise GenerationError(f"--prompt {args.prompt!r} tokenizes to no tokens; give some text")
    generator = torch.Generator(device=device).manual_seed(args.seed)
    output = generate(
        model,
        torch.tensor([ids], dtype=torch.long, device=device),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        cache_window=args.cache_window,
        use_cache=not regular,
        generator=generator,
        eos_token_id=tokenizer.eod,
        vocab_limit=tokenizer.vocab_size,
    )
    return tokenizer.detokenize(output[0].tolist())


@entry_point("generate.py")
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``generate.py``; prints the text, or the error and returns 2."""
    print(run(build_parser().parse_args(argv)))
    return 0
