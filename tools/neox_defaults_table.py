"""Write the table of GPT-NeoX argument defaults (tests/unit/config/neox_defaults.yml).

Reads, from git checkouts of the sources, the argument dataclasses of GPT-NeoX
(``megatron/neox_arguments/neox_args.py`` and ``deepspeed_args.py``: every annotated class
attribute and its default) and the optimizer defaults (``OPT_DEFAULT`` and ``OPT_PARAMS_DEFAULTS``
in ``megatron/neox_arguments/arguments.py``, which apply when a config's optimizer block leaves
them out), and lists each source's config files (``configs/``, and the KERPLE fork's
``kerple_configs/``). The files are parsed, never run.

    python tools/neox_defaults_table.py \\
        --source kerple_fork=/path/to/chijames/KERPLE@25be3d7#github.com/chijames/KERPLE \\
        --source neox_2022=/path/to/EleutherAI/gpt-neox@8d53ee0f#github.com/EleutherAI/gpt-neox \\
        --source neox_current=/path/to/EleutherAI/gpt-neox@ea7aefd8#github.com/EleutherAI/gpt-neox
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kerple.atomic import write_text_atomic  # noqa: E402
from kerple.errors import UsageError, entry_point  # noqa: E402
from kerple.flags import check_unique  # noqa: E402
from kerple.outputs import check_output_file  # noqa: E402

ARGUMENT_FILES = ("megatron/neox_arguments/neox_args.py", "megatron/neox_arguments/deepspeed_args.py")
OPTIMIZER_FILE = "megatron/neox_arguments/arguments.py"
COMPUTED = "<computed at run time>"

HEADER = """\
# GPT-NeoX argument defaults per source: key -> {source: default}. A key a source does not define
# is left out for that source. Facts read from each source's argument dataclasses
# (megatron/neox_arguments/neox_args.py, deepspeed_args.py) and, for the optimizer block, from
# OPT_DEFAULT / OPT_PARAMS_DEFAULTS in megatron/neox_arguments/arguments.py. All three sources are
# Apache-2.0. Written by tools/neox_defaults_table.py; tests/unit/config/test_neox_defaults.py
# holds kerple's defaults to the kerple_fork column (the reference kerple reproduces).
"""


def git_show(repo: Path, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def dataclass_defaults(source: str) -> dict[str, Any]:
    """Annotated class attributes of every class in ``source`` -> default (literal or COMPUTED)."""
    defaults: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                try:
                    defaults[item.target.id] = ast.literal_eval(item.value)
                except ValueError:
                    defaults[item.target.id] = COMPUTED
    return defaults


def module_constant(source: str, name: str) -> Any:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise KeyError(name)


def read_source(repo: Path, commit: str) -> tuple[str, dict[str, Any], list[str]]:
    full = subprocess.run(["git", "-C", str(repo), "rev-parse", commit], check=True, capture_output=True,
                          text=True).stdout.strip()
    defaults: dict[str, Any] = {}
    for path in ARGUMENT_FILES:
        defaults.update(dataclass_defaults(git_show(repo, full, path)))
    arguments = git_show(repo, full, OPTIMIZER_FILE)
    params = module_constant(arguments, "OPT_PARAMS_DEFAULTS")
    defaults["optimizer.type"] = module_constant(arguments, "OPT_DEFAULT")
    for key in ("lr", "betas", "eps"):
        defaults[f"optimizer.params.{key}"] = params[key]
    command = ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", full, "configs", "kerple_configs"]
    listing = subprocess.run(command, check=True, capture_output=True, text=True).stdout.split()
    configs = sorted(path for path in listing if path.endswith((".yml", ".yaml")))
    return full, defaults, configs


def parse_source(spec: str) -> tuple[str, Path, str, str]:
    """``NAME=GIT_DIR@COMMIT[#REPOSITORY]`` -> (name, git folder, commit, repository); a malformed one,
    or a folder that is not a git checkout, is a :class:`UsageError`."""
    name, _, rest = spec.partition("=")
    location, _, repository = rest.partition("#")
    repo, _, commit = location.rpartition("@")
    if not (name and repo and commit):
        raise UsageError(f"--source {spec!r}: expected NAME=GIT_DIR@COMMIT[#REPOSITORY]")
    if not (Path(repo) / ".git").exists() and not (Path(repo) / "HEAD").is_file():
        raise UsageError(f"--source {spec!r}: {repo} is not a git checkout")
    return name, Path(repo), commit, repository


@entry_point("neox_defaults_table.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="neox_defaults_table.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", action="append", required=True, help="NAME=GIT_DIR@COMMIT[#REPOSITORY]")
    parser.add_argument("--out", default="tests/unit/config/neox_defaults.yml")
    args = parser.parse_args(argv)
    specs = [parse_source(spec) for spec in args.source]
    check_unique("--source", [name for name, *_ in specs])
    check_output_file(args.out, "--out")
    sources: dict[str, Any] = {}
    table: dict[str, dict[str, Any]] = {}
    for name, repo, commit, repository in specs:
        try:
            full, defaults, configs = read_source(repo, commit)
        except subprocess.CalledProcessError as error:
            raise UsageError(f"--source {name}: git {' '.join(error.cmd[3:5])} failed in {repo}: "
                             f"{(error.stderr or '').strip() or error.returncode}") from None
        sources[name] = {"repository": repository or str(repo), "commit": full, "configs": configs}
        for key, value in defaults.items():
            table.setdefault(key, {})[name] = value
    document = {"sources": sources, "defaults": dict(sorted(table.items()))}
    text = HEADER + yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=120)
    write_text_atomic(args.out, text)
    print(f"wrote {args.out}: {len(table)} keys from {', '.join(sources)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
