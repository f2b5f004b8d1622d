"""The README and docs/ stay true: links resolve, commands name what exists, the README stays short.

Every relative link of README.md and docs/*.md must reach a file (and a heading, for ``#anchor``
links into Markdown). Every command in a fenced ``bash`` block must name a script that exists, a
``make`` target of the Makefile, config files that exist, and only flags that the script's own
``--help`` lists (for ``analyze.py``, the subcommand's).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_LINES = 250
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```bash\n(.*?)```", re.S)
SKIPPED_WORDS = {"for", "done", "do", "sh", "lm-eval", ".", "export", "cd", "if", "then", "fi", "git", "pip",
                 "PYTHONPATH=/tmp/kerple-gpu-site:.", "name=$(basename", "pe=$(basename"}


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links only outside code blocks
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    for target in _links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: link {target!r} reaches nothing"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name}: no heading #{anchor} in {resolved.name}"


def test_readme_stays_a_front_door() -> None:
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; the budget is {README_LINES} (move detail to docs/)"


def _commands(page: Path) -> list[str]:
    """The shell commands of the page's bash blocks, continuation lines joined, comments removed."""
    commands, pending = [], ""
    for block in FENCE.findall(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            pending = f"{pending}\n{line}" if pending else line
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:  # a quoted string goes on over the next line
                continue
            pending = ""
            if words:
                commands.append(words)
    return commands


@functools.lru_cache(maxsize=None)
def _help(script: str, subcommand: str | None) -> str:
    """The ``--help`` text of a script (and subcommand), run offline on the CPU."""
    command = [sys.executable, script, *([subcommand] if subcommand else []), "--help"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"{' '.join(command)} failed: {done.stderr[-500:]}"
    return done.stdout


def _check_python(words: list[str], where: str) -> None:
    scripts = [w for w in words if w.endswith(".py")]
    assert scripts, where
    for script in scripts:
        assert (REPO / script).is_file(), f"{where}: no script {script}"
    script = scripts[-1] if scripts[0] == "deepy.py" else scripts[0]  # deepy.py forwards its flags to train.py
    after = words[words.index(script) + 1:]
    subcommand = after[0] if after and re.fullmatch(r"[a-z][a-z\-]+", after[0]) and script == "analyze.py" else None
    text = _help(script, subcommand) + (_help("deepy.py", None) if "deepy.py" in words else "")
    for flag in (w.split("=")[0] for w in after if w.startswith("--")):
        assert re.search(rf"(^|[\s\[,]){re.escape(flag)}\b", text, re.M), f"{where}: {script} has no {flag}"


def _check_paths(words: list[str], where: str) -> None:
    for word in words:
        for candidate in word.split(","):
            if re.fullmatch(r"configs/(models|pe|data|setups)/[\w.\-]+\.yml", candidate):
                assert (REPO / candidate).is_file(), f"{where}: no file {candidate}"


def _check_make(words: list[str], where: str) -> None:
    targets = re.findall(r"^([\w\-]+):", (REPO / "Makefile").read_text(), re.M)
    named = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    for target in named:
        assert target in targets, f"{where}: make has no target {target}"


def test_commands_name_what_exists() -> None:
    """One test for every page, so each script's ``--help`` runs once."""
    for page in PAGES:
        _check_commands(page)


def _check_commands(page: Path) -> None:
    for words in _commands(page):
        where = f"{page.name}: {' '.join(words)[:80]}"
        first = next((w for w in words if "=" not in w or w.startswith("-")), words[0])
        if first in SKIPPED_WORDS or first.startswith("$") or words[:2] == ["python", "-c"]:
            continue
        if first == "make":
            _check_make(words, where)
        elif first in ("python", "python3") or first.endswith(".py"):
            _check_python(words, where)
        _check_paths(words, where)


def test_make_help_lists_every_target_with_what_it_does() -> None:
    """``make help`` prints one described line for each target the Makefile declares phony."""
    phony = re.search(r"^\.PHONY:(.*)$", (REPO / "Makefile").read_text(), re.M).group(1).split()
    shown = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    described = dict(re.findall(r"^  make (\S+) +(\S.*)$", shown, re.M))
    assert sorted(described) == sorted(phony), shown
