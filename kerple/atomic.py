"""Atomic single-file writes: write beside the target, fsync, rename into place.

Every writer in kerple that must never leave a half-written file behind (checkpoint shards,
``latest``, evaluation JSON, comparison tables, figures, resolved configs, dataset caches) goes
through :func:`atomic_path`:

* the content is written to a temporary file in the *same folder* as the target (so the final
  :func:`os.replace` is a rename within one file system, atomic on POSIX);
* the temporary file is fsynced before the rename, so a crash right after the rename cannot expose
  an empty or truncated file;
* on any exception (``KeyboardInterrupt`` included) the temporary file is removed and the old
  target, if any, is left untouched.

Directory-level atomicity (a checkpoint tag built under a temporary folder, renamed, then
``latest`` replaced last) stays with the checkpoint code; it uses these helpers per file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "torch_save_atomic", "write_bytes_atomic", "write_json_atomic", "write_text_atomic"]


def _fsync_file(path: Path) -> None:
    """Flush ``path``'s data to disk (the file is reopened, so any writer may have produced it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _current_umask() -> int:
    """The process umask (reading it requires setting it; it is restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it onto ``path``.

    The temporary file already exists (empty) when the body runs; the body writes it by name (any
    library that takes a file name works). Missing parent folders are created. If the body raises,
    the temporary file is removed, ``path`` is left as it was, and the exception propagates.
    ``suffix`` ends the temporary name (e.g. ``".png"`` for writers that infer the format from it).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
    os.close(handle)
    temporary = Path(name)
    # mkstemp creates the file 0600; give the result the mode a plain open() would (0666 & ~umask),
    # so checkpoints and results in a shared lab folder stay readable by the group.
    os.chmod(temporary, 0o666 & ~_current_umask())
    try:
        yield temporary
        _fsync_file(temporary)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | os.PathLike[str], payload: bytes) -> Path:
    """Write ``payload`` to ``path`` atomically; return ``path`` as a :class:`Path`."""
    target = Path(path)
    with atomic_path(target) as temporary:
        temporary.write_bytes(payload)
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; return ``path`` as a :class:`Path`."""
    target = Path(path)
    with atomic_path(target) as temporary:
        with open(temporary, "w", encoding=encoding) as stream:
            stream.write(text)
    return target


def write_json_atomic(path: str | os.PathLike[str], doc: Any, *, indent: int | None = 1) -> Path:
    """Write ``doc`` as JSON (NaN/Infinity allowed, trailing newline) to ``path`` atomically."""
    return write_text_atomic(path, json.dumps(doc, indent=indent, allow_nan=True) + "\n")


class _WriteErrorKept:
    """A binary file that keeps the ``OSError`` of a failed write: torch's zip writer reports a write
    that failed (a full disk) as a ``RuntimeError`` about stream positions, and the cause is lost."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.error = handle, None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.handle.flush()


def torch_save_atomic(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(obj)`` to ``path`` atomically; return ``path`` as a :class:`Path`. A failed write
    (``ENOSPC``: the disk is full) raises its ``OSError``, not torch's ``RuntimeError``."""
    import torch  # deferred: most users of this module never need torch

    target = Path(path)
    with atomic_path(target) as temporary:
        with open(temporary, "wb") as handle:
            writer = _WriteErrorKept(handle)
            try:
                torch.save(obj, writer)
            except RuntimeError:
                if writer.error is None:
                    raise
                raise writer.error from None
    return target
