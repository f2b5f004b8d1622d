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
import logging
import sys
from collections.abc import Callable
from typing import Any, Sequence, TextIO

import torch
from torch import nn

from kerple.errors import KerpleError, entry_point
from kerple.generate_arguments import GenerationError, build_parser, check_arguments
from kerple.positional.base import PositionKind
from kerple.config import split_arguments
from kerple.runs import load_run, resolve_device, run_config


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
    if positional is not None and positional.kind == PositionKind.INPUT and positional.learnable:
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
    on_token: Callable[[torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Continue ``prompt [b, s]`` (int64) by up to ``max_new_tokens``; returns ``[b, s + n]``.

    ``use_cache=False`` recomputes the whole sequence every step (the slow reference path, with
    ``attention_window = cache_window`` so both paths compute the same function).
    ``vocab_limit`` masks the padded vocabulary rows (ids >= the tokenizer's size).
    Generation stops early once every row has produced ``eos_token_id``. ``on_token`` receives each
    step's new tokens ``[b]`` as they are chosen (``generate.py`` prints them as they come).
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be [batch, length >= 1], got {tuple(prompt.shape)}")
    _check_length(model, prompt.shape[1] + max_new_tokens)
    model.eval()
    sequence = prompt
    finished = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    windowed = not use_cache and cache_window is not None  # the reference path of a cache window
    saved_window = model.attention_window if windowed else None
    cache = model.new_cache(window=cache_window) if use_cache else None
    try:
        if windowed:
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
            if on_token is not None:
                on_token(token)
            if eos_token_id is not None and bool(finished.all()):
                break
            if use_cache:
                logits = model(token[:, None], cache=cache)[:, -1]  # one new query row
            else:
                logits = model(sequence)[:, -1]
    finally:
        if windowed:
            model.set_attention(window=saved_window)
    return sequence


class TextStream:
    """Writes a prompt's text, then each generated token's text as it comes, to ``stream``.

    A token's text is read off the decoding of the tokens since the last written line (with one token
    before them, so that a SentencePiece word keeps its leading space); a token that ends inside a
    UTF-8 character waits for the next one. :meth:`close` writes what is left and a final newline; the
    whole is the decoding of all the tokens at once.
    """

    def __init__(self, tokenizer: Any, prompt_ids: list[int], stream: TextIO) -> None:
        self.tokenizer, self.stream = tokenizer, stream
        self.ids = list(prompt_ids)
        self.anchor = len(self.ids)  # the text of the tokens before it is written
        self.written = ""  # the text of the tokens from the anchor on that is written
        self._write(tokenizer.detokenize(self.ids))

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _pending(self) -> str:
        context = self.ids[max(self.anchor - 1, 0): self.anchor]
        return self.tokenizer.detokenize(context + self.ids[self.anchor:])[len(self.tokenizer.detokenize(context)):]

    def push(self, token: torch.Tensor) -> None:
        self.ids.append(int(token[0]))
        text = self._pending()
        if text.endswith("\ufffd") or not text.startswith(self.written):
            return
        self._write(text[len(self.written):])
        self.written = text
        if text.endswith("\n") or len(self.ids) - self.anchor >= 256:  # keeps each decoding short
            self.anchor, self.written = len(self.ids), ""

    def close(self) -> None:
        text = self._pending()
        rest = text[len(self.written):] if text.startswith(self.written) else text
        self._write(rest + "\n")


def check_tokenizer_matches_checkpoint(cfg: Any, args: argparse.Namespace) -> None:
    """Warn when the YAML files name a ``tokenizer_type`` other than the one in the checkpoint's own
    ``configs/`` (the text would be decoded with the wrong tokenizer: garbage)."""
    from kerple.checkpoint.files import checkpoint_config_files
    from kerple.config import load_config

    if not split_arguments(args.configs)[0]:
        return  # the run's own config is used
    log = logging.getLogger("kerple.config")
    level, log.level = log.level, logging.WARNING  # the stored config's own notes are not this run's
    try:
        stored = checkpoint_config_files(args.load, args.iteration)
        trained = load_config(stored).data.tokenizer_type
    except (KerpleError, OSError):
        return  # a Hugging Face export or a checkpoint without configs/: nothing to compare with
    finally:
        log.setLevel(level)
    if trained != cfg.data.tokenizer_type:
        print(f"generate.py: warning: tokenizer_type {cfg.data.tokenizer_type} ({cfg.provenance('data.tokenizer_type')[0]}) "
              f"is not the checkpoint's {trained} ({stored[0]}): the text will be decoded wrongly; give no YAML files "
              "to use the run's own config, or set tokenizer_type and its files to the checkpoint's", file=sys.stderr)


def run(args: argparse.Namespace, stream: TextIO | None = None) -> str:
    """Check the flags, load config, tokenizer and weights; return the generated text (prompt included),
    written to ``stream`` as it comes when one is given."""
    from kerple.data.tokenizers import check_vocabulary_fits, configured_tokenizer
    from kerple.model import family_of

    check_arguments(args)
    cfg = run_config(args.configs, args.load, args.iteration).cfg
    check_tokenizer_matches_checkpoint(cfg, args)
    family = family_of(cfg)
    if args.cache_window is not None and not family.kv_cache:
        raise GenerationError(f"--cache-window: model.arch {family.name} has no KV cache; drop the option")
    # The tokenizer first: a bad tokenizer file fails in a second, before the weights are read.
    tokenizer = configured_tokenizer(cfg)
    if tokenizer is None:
        raise GenerationError("the config names no tokenizer (tokenizer_file, or vocab_file and merge_file); "
                              "add the one the model was trained with, e.g. tokenizer_file=PATH")
    check_vocabulary_fits(cfg, tokenizer)
    device = resolve_device(args.device)
    model = load_run(cfg, args.load, args.iteration, trust=args.trust_checkpoint, device=device, flex_compile=False).model
    ids = tokenizer.tokenize(args.prompt)
    if not ids:
        raise GenerationError(f"--prompt {args.prompt!r} tokenizes to no tokens; give some text")
    generator = torch.Generator(device=device).manual_seed(args.seed)
    streamed = TextStream(tokenizer, ids, stream) if stream is not None else None
    output = generate(
        model,
        torch.tensor([ids], dtype=torch.long, device=device),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        cache_window=args.cache_window,
        use_cache=family.kv_cache,
        generator=generator,
        eos_token_id=tokenizer.eod,
        vocab_limit=tokenizer.vocab_size,
        on_token=None if streamed is None else streamed.push,
    )
    if streamed is not None:
        streamed.close()
    return tokenizer.detokenize(output[0].tolist())


@entry_point("generate.py")
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``generate.py``; prints the text as it is generated, ending with a newline, or the
    error and returns 2."""
    run(build_parser().parse_intermixed_args(argv), stream=sys.stdout)
    return 0
