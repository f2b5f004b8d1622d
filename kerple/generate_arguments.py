"""``generate.py``'s command line: its flags and the checks that need no model, config or torch.

Kept apart from :mod:`kerple.inference.generate` (whose package loads torch) so that ``generate.py``
refuses a bad flag in a fraction of a second (:func:`kerple.flags.heavy_imports`).
"""

from __future__ import annotations

import argparse
import math

from kerple.cli import add_config_arguments
from kerple.errors import KerpleError


class GenerationError(KerpleError):
    """The generation asked for cannot run (prompt, length or cache window); the message says why."""


MAX_NEW_TOKENS = 65_536
"""Most tokens one ``generate.py`` call produces: 4x the longest length KERPLE's Table 3 evaluates
(16,384). A KV cache of 162M's 12 layers at this length takes 4.8 GB in fp32."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="generate.py", usage="generate.py [CONFIG.yml ...] [KEY=VALUE ...] --load DIR --prompt TEXT [options]",
        description="Continue a prompt with a trained checkpoint (KV cache; greedy, or sampling with --temperature).",
    )
    add_config_arguments(parser, "no YAML: the run's own, from the configs/ folder of the checkpoint --load names")
    parser.add_argument("--load", required=True, help="checkpoint directory (kerple, GPT-NeoX/KERPLE, or a HF export)")
    parser.add_argument("--iteration", type=int, help="checkpoint iteration (default: the 'latest' tag)")
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=64, help=f"at most {MAX_NEW_TOKENS:,} (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, help="nucleus sampling mass")
    parser.add_argument("--cache-window", type=int, help="keep only the last W keys/values (thesis §4.9.2)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--trust-checkpoint", action="store_true", help="allow pickles that may run code (trusted files only)")
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse sampling settings that cannot mean anything (``GenerationError`` naming the flag)."""
    checks = (
        ("--max-new-tokens", args.max_new_tokens,
         args.max_new_tokens is not None and not 1 <= args.max_new_tokens <= MAX_NEW_TOKENS,
         f"an integer from 1 to {MAX_NEW_TOKENS:,} (4x the paper's longest evaluation length)"),
        ("--temperature", args.temperature, not (args.temperature >= 0 and math.isfinite(args.temperature)),
         "a finite number >= 0 (0 = greedy)"),
        ("--top-p", args.top_p, args.top_p is not None and not 0 < args.top_p <= 1, "a number in (0, 1]"),
        ("--top-k", args.top_k, args.top_k is not None and args.top_k < 0, "an integer >= 0 (0 = no limit)"),
        ("--cache-window", args.cache_window, args.cache_window is not None and args.cache_window < 1,
         "an integer of at least 1 (keys kept)"),
        ("--iteration", args.iteration, args.iteration is not None and args.iteration < 0, "an integer >= 0"),
    )
    for flag, value, bad, expected in checks:
        if bad:
            raise GenerationError(f"{flag} {value}: expected {expected}")
    sampling = [flag for flag, value in (("--top-k", args.top_k), ("--top-p", args.top_p)) if value is not None]
    if sampling and args.temperature == 0:
        raise GenerationError(f"{' and '.join(sampling)} shape sampling, and --temperature 0 (the default) decodes "
                              "greedily, which ignores them: give a --temperature above 0 (e.g. 0.8), or drop "
                              f"{' and '.join(sampling)}")


def check_command_line(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` and refuse the flags that cannot mean anything (``GenerationError``)."""
    args = build_parser().parse_intermixed_args(argv)
    check_arguments(args)
    return args
