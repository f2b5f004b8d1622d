"""The ``python`` corpus: every Python source file already on this machine, offline.

``prepare_data.py python`` reads the ``.py`` files of the running interpreter's standard library and
of its installed packages (``site-packages``), keeps one copy of each distinct content (SHA-256 of
the bytes; the first key in sorted order wins, so a file vendored by two packages is one document)
and holds documents out *by file* (:func:`kerple.data.sources.hold_out`: a hash of the file's key
decides its split), so no file, and no copy of it, is in two splits. ``--root DIR`` reads other
folders instead.

The files are read where they are installed and never leave the machine; what a training run keeps
is a model and numbers. The installed packages' own licence metadata is summarised in the prepared
dataset's ``info.json`` (``source.licenses``: documents per licence) so a user can see what the
corpus holds before sharing anything trained on it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import os
import site
import stat
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerple.data.errors import DataError

STDLIB_LICENSE = "PSF-2.0"  # the Python Software Foundation License of CPython's standard library
UNKNOWN_LICENSE = "unknown"
LICENSE_TEXT_LIMIT = 60  # some packages put the whole licence text in `License`: keep its first line


@dataclass(frozen=True)
class SourceRoot:
    """A folder to read: ``label`` starts every document key (``stdlib/json/decoder.py``). The
    standard library's root names its licence and skips the package folders nested in it; other
    roots take each file's licence from the metadata of the distribution that installed it."""

    label: str
    path: Path
    stdlib: bool = False


@dataclass(frozen=True)
class PythonFile:
    """One kept document: its key (label + relative path), its file, and the licence it ships under."""

    key: str
    path: Path
    size: int
    license: str


def default_roots() -> list[SourceRoot]:
    """The interpreter's standard library and every site-packages folder it reads, existing ones only."""
    roots = [SourceRoot("stdlib", Path(sysconfig.get_paths()["stdlib"]), stdlib=True)]
    folders = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    seen: set[Path] = set()
    for folder in folders:
        path = Path(folder)
        if path.is_dir() and path.resolve() not in seen:
            seen.add(path.resolve())
            roots.append(SourceRoot("site-packages", path))
    return roots


def _license_of(metadata: Any) -> str:
    """A distribution's licence: its SPDX ``License-Expression``, else its ``License :: `` classifiers,
    else the first line of ``License``."""
    expression = metadata.get("License-Expression")
    if expression:
        return str(expression).strip()
    classifiers = [c.split("::")[-1].strip() for c in metadata.get_all("Classifier") or []
                   if c.startswith("License ::")]
    if classifiers:
        return " / ".join(sorted(set(classifiers)))
    text = (metadata.get("License") or "").strip().splitlines()
    return text[0][:LICENSE_TEXT_LIMIT] if text and text[0].strip() not in ("", "UNKNOWN") else UNKNOWN_LICENSE


def distribution_licenses(folder: Path) -> dict[Path, str]:
    """Resolved path of every file a distribution installed in ``folder`` -> that distribution's licence."""
    owners: dict[Path, str] = {}
    for distribution in importlib.metadata.distributions(path=[str(folder)]):
        license_name = _license_of(distribution.metadata)
        for record in distribution.files or ():
            if record.suffix == ".py":
                owners[Path(distribution.locate_file(record)).resolve()] = license_name
    return owners


PACKAGE_FOLDERS = ("site-packages", "dist-packages")  # inside the standard library: read as roots of their own


def _size(path: str) -> int:
    """Bytes of a regular file; 0 for anything else (a folder named ``x.py``, a broken link)."""
    try:
        status = os.stat(path)
    except OSError:
        return 0
    return status.st_size if stat.S_ISREG(status.st_mode) else 0


def _python_files(root: SourceRoot) -> Iterator[tuple[str, str]]:
    """(key, path) of every non-empty ``.py`` file under ``root``; the standard library without its
    own package folders. Plain strings and ``os.walk``: pathlib's ``rglob`` takes seconds longer on a
    site-packages folder."""
    if not root.path.is_dir():
        raise DataError(f"{root.path}: folder not found (--root names folders of Python sources)")
    base = str(root.path)
    for folder, subfolders, names in os.walk(base):
        if root.stdlib:
            subfolders[:] = [name for name in subfolders if name not in PACKAGE_FOLDERS]
        relative = os.path.relpath(folder, base).replace(os.sep, "/")
        prefix = f"{root.label}/" if relative == "." else f"{root.label}/{relative}/"
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".py") and _size(path) > 0:
                yield prefix + name, path


def candidates(roots: Sequence[SourceRoot], order: Callable[[str], Any] | None = None) -> list[tuple[SourceRoot, str, str]]:
    """``(root, key, path)`` of every non-empty ``.py`` file under ``roots``, sorted by ``order(key)``
    (by key when ``order`` is None)."""
    found = [(root, key, path) for root in roots for key, path in _python_files(root)]
    rank = order or (lambda key: key)
    return sorted(found, key=lambda item: rank(item[1]))


def distinct_files(found: Iterable[tuple[SourceRoot, str, str]], roots: Sequence[SourceRoot],
                   counts: Counter) -> Iterator[tuple[PythonFile, bytes]]:
    """Each file of ``found`` whose bytes no earlier file had, with its bytes and licence, read as it
    is asked for; ``counts`` gains ``unreadable`` and ``duplicates_removed``."""
    owners: dict[Path, str] = {}
    for root in roots:
        if not root.stdlib:
            owners.update(distribution_licenses(root.path))
    seen: set[str] = set()
    for root, key, path in found:
        try:
            with open(path, "rb") as handle:
                payload = handle.read()
        except OSError:  # a file this user may not read (or one removed meanwhile) is no document
            counts["unreadable"] += 1
            continue
        digest = hashlib.sha256(payload).hexdigest()
        if digest in seen:
            counts["duplicates_removed"] += 1
            continue
        seen.add(digest)
        license_name = STDLIB_LICENSE if root.stdlib else owners.get(Path(path).resolve(), UNKNOWN_LICENSE)
        yield PythonFile(key, Path(path), len(payload), license_name), payload


def found_details(roots: Sequence[SourceRoot], files_found: int, counts: Counter,
                  kept: Sequence[PythonFile]) -> dict[str, Any]:
    """The ``source`` details of a prepared dataset's ``info.json``: what was found, read and kept."""
    return {
        "roots": [f"{root.label}={root.path}" for root in roots],
        "files_found": files_found,
        "unreadable": counts["unreadable"],
        "duplicates_removed": counts["duplicates_removed"],
        "files_kept": len(kept),
        "bytes_kept": sum(item.size for item in kept),
        "licenses": dict(Counter(item.license for item in kept).most_common()),
    }


def python_files(roots: Sequence[SourceRoot], limit: int | None = None) -> tuple[list[PythonFile], dict[str, Any]]:
    """The distinct ``.py`` files under ``roots`` in key order (the first ``limit`` of them), and what
    was found: files, duplicates removed (same bytes as a kept file), bytes kept, documents per licence."""
    found, counts = candidates(roots), Counter()
    kept = [item for item, _ in itertools.islice(distinct_files(found, roots, counts), limit)]
    if not kept:
        raise DataError(f"no .py files under {', '.join(str(root.path) for root in roots)}")
    return kept, found_details(roots, len(found), counts, kept)


def roots_from_paths(paths: Sequence[str | Path]) -> list[SourceRoot]:
    """``--root`` folders as roots labelled by their own name (``--root /x/mypkgs`` -> ``mypkgs/...``)."""
    return [SourceRoot(Path(path).name or "root", Path(path)) for path in paths]
