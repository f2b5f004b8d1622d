"""What the entry points share on their command lines: the config words, as GPT-NeoX writes them.

Every command that reads a run takes YAML files merged in order, then ``key=value`` overrides of any
config key (``train.py configs/models/tiny.yml configs/pe/alibi.yml train_iters=50``). The words
may come before, between or after the command's own flags (the commands parse with argparse's
``parse_intermixed_args``); :func:`add_config_arguments` declares them, so ``--help`` shows them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

CONFIG_METAVAR = "CONFIG.yml|KEY=VALUE"
"""How ``--help`` names the config words (usage line and positional list)."""

CONFIG_HELP = ("YAML config files, merged in order (a later file wins), then key=value overrides of any config "
               "key (docs/config.md), e.g. train_iters=100 lr=3e-4")


def add_config_arguments(parser: argparse.ArgumentParser, detail: str = "", *, required: bool = False) -> None:
    """The positional ``configs`` list: YAML files, then ``key=value`` overrides; ``detail`` ends
    its help line (e.g. where the config comes from when no YAML is named)."""
    parser.add_argument("configs", nargs="+" if required else "*", metavar=CONFIG_METAVAR,
                        help=CONFIG_HELP + (f"; {detail}" if detail else ""))


def config_key_hint(unknown: Iterable[str], argv: list[str]) -> str:
    """``"config keys are key=value words: train_iters=5"`` when an unknown ``--flag`` of ``argv``
    names a config key (the spelling of argparse-style trainers), else ``""``."""
    from kerple.config.neox_keys import KEY_INDEX, normalize_key

    for word in unknown:
        name, equals, value = word.removeprefix("--").partition("=")
        if not word.startswith("--") or normalize_key(name) not in KEY_INDEX:
            continue
        if not equals and word in argv and argv.index(word) + 1 < len(argv):
            value = argv[argv.index(word) + 1]
        return f"config keys are key=value words: {normalize_key(name)}={value or 'VALUE'}"
    return ""


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str], note: str = "") -> argparse.Namespace:
    """``parser.parse_intermixed_args(argv)``, whose refusal of unknown words adds ``note`` (e.g. the
    command's own flags) and, for a ``--flag`` that is a config key, how to set the key."""
    args, unknown = parser.parse_known_intermixed_args(argv)
    if unknown:
        said = "; ".join(part for part in (note, config_key_hint(unknown, argv)) if part)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" ({said})" if said else ""))
    return args


def split_arguments(arguments: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split command-line words into YAML paths and ``key=value`` overrides (words with ``=``),
    each in the order given; every entry point reads its config arguments this way."""
    paths: list[str] = []
    overrides: list[str] = []
    for word in arguments:
        (overrides if "=" in word else paths).append(word)
    return paths, overrides
