"""``evaluate.py``'s command line: its flags and the checks that need no model, config or torch.

Kept apart from :mod:`kerple.evaluation.cli` so that ``evaluate.py`` refuses a bad flag or output
path in a fraction of a second, before it loads torch (:func:`kerple.flags.heavy_imports`).
"""

from __future__ import annotations

import argparse

from kerple.cli import add_config_arguments, parse_command_line, split_arguments
from kerple.evaluation import protocols
from kerple.evaluation.errors import EvaluationError
from kerple.outputs import check_output_file

ATTENTION_IMPL_CHOICES = ("eager", "sdpa", "flex", "triton", "auto")
"""``kerple.model.ATTENTION_IMPLS`` and ``auto``, written out: this module answers ``--help`` without torch."""

DEFAULT_NUM_TOKENS = 32768
"""Scored tokens per length unless ``--num-tokens`` says otherwise: the Quick start's five lengths
then take minutes on 2 CPU cores, where its whole validation split takes about 25."""
USAGE = ("evaluate.py [CONFIG.yml ...] [KEY=VALUE ...] [--load DIR] --eval-lengths L1,L2,... --output FILE.json "
         "[options]")
DESCRIPTION = "Perplexity of a trained checkpoint at several lengths (KERPLE §5.2, §5.5)."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evaluate.py", usage=USAGE, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_arguments(parser, "no YAML: the run's own, from the configs/ folder of the checkpoint --load names")
    parser.add_argument("--load", help="checkpoint directory (default: the config's load, else save)")
    parser.add_argument("--iteration", type=int, help="checkpoint iteration (default: the 'latest' tag)")
    parser.add_argument("--eval-lengths", required=True, help="comma-separated lengths, e.g. 512,1024,2048")
    parser.add_argument("--protocol", choices=protocols.PROTOCOLS, default="nonoverlap")
    parser.add_argument("--split", choices=("valid", "test", "train"), default="valid")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--num-tokens",
                        help=f"score this many tokens at every length (nonoverlap/sliding; default {DEFAULT_NUM_TOKENS}, "
                             "raised to the longest length); 'all' scores the whole split")
    budget.add_argument("--num-windows", type=int, help="a fixed number of windows at every length")
    parser.add_argument("--stride", type=int, help="stride S of the sliding protocol")
    parser.add_argument("--attention-window", type=int, help="restrict attention to the last W keys (thesis §4.3.3)")
    parser.add_argument("--attention-impl", choices=ATTENTION_IMPL_CHOICES,
                        help="auto picks per length and device (kerple.model.choose_implementation); triton: "
                             "the fused kernel of the distance tables (CUDA)")
    parser.add_argument("--softmax-temperature", default="1",
                        help="divide the attention logits by tau in (0, 1] (thesis §5.4), or 'log': "
                             "tau = log_L(train length) at each length L (thesis §5.5)")
    parser.add_argument("--cache-window", type=int,
                        help="decode through a KV cache holding only the last W keys/values (thesis §4.9.2)")
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="allow arbitrary pickled objects in the checkpoint (only for files you trust)")
    parser.add_argument("--per-position", action="store_true", help="also record the mean loss at each position")
    parser.add_argument("--per-document", action="store_true",
                        help="also record the perplexity of every held-out document (printed largest first)")
    parser.add_argument("--tokens-per-batch", type=int, default=16384, help="windows per forward = this // length")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    parser.add_argument("--output", required=True, help="results JSON, written atomically")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse impossible numbers before any work (``EvaluationError`` naming the flag)."""
    for flag, value, least in (
        ("--num-windows", args.num_windows, 1), ("--stride", args.stride, 1), ("--cache-window", args.cache_window, 1),
        ("--tokens-per-batch", args.tokens_per_batch, 1), ("--attention-window", args.attention_window, 1),
        ("--iteration", args.iteration, 0),
    ):
        if value is not None and value < least:
            raise EvaluationError(f"{flag} {value}: expected an integer of at least {least}")
    if args.num_tokens is not None and args.num_tokens != "all":
        try:
            count = int(args.num_tokens)
        except ValueError:
            raise EvaluationError(f"--num-tokens {args.num_tokens!r}: expected a positive integer or 'all'") from None
        if count < 1:
            raise EvaluationError(f"--num-tokens {count}: expected a positive integer or 'all'")
    if not args.configs and not args.load:
        raise EvaluationError("no config: name the run's YAML files, or pass --load DIR of a checkpoint with configs/")


def check_command_line(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` and refuse what is wrong without a config or a model: the numbers, and an
    output that cannot be written or would replace an input (``EvaluationError``/``UsageError``)."""
    args = parse_command_line(build_parser(), argv)
    check_arguments(args)
    check_output_file(args.output, "--output", inputs=split_arguments(args.configs)[0],
                      folders=[args.load] if args.load else [])
    return args

