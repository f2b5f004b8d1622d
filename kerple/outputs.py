"""Output paths checked before the work that fills them.

A command that would write its result after minutes of work (a checkpoint folder, a results JSON, a
converted checkpoint, a tokenized corpus) first checks here that it can: the path is not a file
where a folder is needed (or a folder where a file is), no regular file sits on the way to it, the
nearest existing folder accepts a new file, and an output does not overwrite one of the command's
inputs. Nothing is created by the checks (a scratch file is made and removed at once). The
:class:`~kerple.errors.UsageError` names the option or config key, the path, and the fix.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kerple.errors import UsageError


def _existing_folder(folder: Path, output: Path, what: str) -> Path:
    """The nearest existing part of ``folder`` (itself included), where ``output`` would be created;
    a regular file there is refused."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise UsageError(f"{what} {output}: {candidate} is a file, not a folder; choose a path outside it")
            return candidate
    return Path(".")


def _check_can_create_in(folder: Path, path: Path, what: str) -> None:
    try:
        handle, scratch = tempfile.mkstemp(dir=folder, prefix=".kerple-write-check.")
    except OSError as error:
        raise UsageError(f"{what} {path}: cannot write in {folder} ({error.strerror}); choose a writable path") from None
    os.close(handle)
    os.unlink(scratch)


def check_output_folder(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a folder output ``path`` that is a file, lies under a file, or cannot be created or
    written (``what`` names it in the message: ``"--output-dir"``, ``"save (a.yml)"``)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{what} {target} is a file; a folder is needed there: choose another path")
    _check_can_create_in(_existing_folder(target, target, what), target, what)


def check_output_file(path: str | os.PathLike[str], what: str, inputs: Iterable[str | os.PathLike[str]] = (),
                      folders: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Refuse a file output ``path`` that is a folder, lies under a file, cannot be written, is
    one of ``inputs`` (the command's input files, e.g. its YAML configs, or its other outputs:
    writing would replace one), or lies inside one of ``folders`` (checkpoints the command reads:
    a result written there could replace ``latest`` or a weight file; a folder without one is left
    to the command's own "no checkpoint" message)."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{what} {target} is a folder; name a file")
    for folder in map(Path, folders):
        if target.resolve().is_relative_to(folder.resolve()) and _holds_checkpoint(folder):
            raise UsageError(f"{what} {target} is inside {folder}, the checkpoint this command reads; "
                             "write results outside checkpoint folders")
    for source in map(Path, inputs):
        same = target.samefile(source) if target.exists() and source.exists() else target.resolve() == source.resolve()
        if same:
            also = "" if str(source) == str(target) else f" (as {source})"
            raise UsageError(f"{what} {target} is also read or written by this command{also}; writing it would "
                             "replace that file: choose another path")
    _check_can_create_in(_existing_folder(target.parent, target, what), target, what)


def _holds_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint (a ``latest`` tag, tag folders, weight files) or a Hugging
    Face export; ``find_checkpoint``'s refusals count as holding one (their files are there)."""
    from kerple.checkpoint.errors import CheckpointError
    from kerple.checkpoint.files import find_checkpoint

    try:
        return (folder / "model.safetensors").is_file() or find_checkpoint(folder) is not None
    except CheckpointError:
        return True
