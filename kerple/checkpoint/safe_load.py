"""Read ``.pt`` pickles without running their code (opening one must not run its code).

``torch.load(weights_only=True)`` only rebuilds tensors, containers and an allowlist of globals.
GPT-NeoX / DeepSpeed files also hold a few plain data types (an ``argparse.Namespace`` of
arguments, NumPy RNG states, ``pathlib`` paths, DeepSpeed's loss-scaler records); those are added
here. Anything else - in particular any callable such as ``os.system`` that a malicious pickle
would invoke through ``__reduce__`` - is refused *before* unpickling: the file's globals are
listed by scanning its opcodes (:func:`torch.serialization.get_unsafe_globals_in_checkpoint`),
which executes nothing. The error names every offending global and the opt-in flag
``--trust-checkpoint`` (``trust=True``), which falls back to ``weights_only=False``.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import pathlib
import pickle
import re
import zipfile
from typing import Any

import torch

from kerple.checkpoint.errors import CheckpointError, UnsafeCheckpointError

TRUST_FLAG = "--trust-checkpoint"

# Plain-data classes of DeepSpeed that appear in optimizer / engine state. They are imported only
# when a file names them (importing DeepSpeed is slow), and only rebuilt as data (``__new__`` plus
# attribute state), never called with file-controlled code.
_OPTIONAL_DATA_CLASSES: tuple[str, ...] = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


def _numpy_globals() -> list[Any]:
    """NumPy array / scalar / dtype reconstructors under both the NumPy 1.x and 2.x module names."""
    try:
        import numpy as np
    except ImportError:
        return []
    try:
        from numpy._core import multiarray
    except ImportError:  # NumPy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    entries: list[Any] = [np.ndarray, np.dtype]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        entries.append((multiarray._reconstruct, f"{module}._reconstruct"))
        entries.append((multiarray.scalar, f"{module}.scalar"))
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        for name in dir(dtypes):
            if name.endswith("DType"):
                entries.append(getattr(dtypes, name))
    return entries


def allowed_globals() -> list[Any]:
    """The globals :func:`safe_torch_load` accepts beyond torch's own defaults.

    Entries are objects or ``(object, "qualified.name")`` pairs, as
    :func:`torch.serialization.safe_globals` takes them.
    """
    entries: list[Any] = [
        argparse.Namespace,
        collections.OrderedDict,
        collections.defaultdict,
        pathlib.PosixPath,
        pathlib.WindowsPath,
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
        pathlib.Path,
    ]
    return entries + _numpy_globals()


def _name_of(entry: Any) -> str:
    if isinstance(entry, tuple):
        return entry[1]
    return f"{entry.__module__}.{entry.__qualname__}"


def _optional_globals(names: list[str]) -> list[Any]:
    """Import the DeepSpeed data classes among ``names`` (those that can be imported)."""
    found = []
    for name in names:
        if name not in _OPTIONAL_DATA_CLASSES:
            continue
        module, _, attribute = name.rpartition(".")
        try:
            found.append((getattr(importlib.import_module(module), attribute), name))
        except (ImportError, AttributeError):
            continue
    return found


def _refusal(path: os.PathLike[str] | str, offending: list[str]) -> UnsafeCheckpointError:
    listed = ", ".join(sorted(set(offending)))
    return UnsafeCheckpointError(
        f"refusing to load {path}: it needs the global(s) {listed}, which are not plain data types "
        f"(a pickle can use them to run code). Nothing was executed. If you trust where this file "
        f"came from, pass {TRUST_FLAG} (trust=True) to load it with weights_only=False.",
        sorted(set(offending)),
    )


def scan_unsafe_globals(path: os.PathLike[str] | str) -> list[str] | None:
    """Globals in ``path`` outside torch's defaults and :func:`allowed_globals`, without unpickling.

    Returns ``None`` when the file cannot be scanned (legacy, non-zip ``torch.save`` format); the
    weights-only unpickler still guards the load then.
    """
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(os.fspath(path))
    except Exception:  # legacy format or not a torch file: let torch.load report it
        return None
    allowed = {_name_of(entry) for entry in allowed_globals()}
    allowed |= {name for _, name in _optional_globals(names)}
    return [name for name in names if name not in allowed]


def safe_torch_load(path: os.PathLike[str] | str, trust: bool = False, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """``torch.load`` that never executes code from the file unless ``trust`` is set.

    Safe mode scans the file's globals first and raises :class:`UnsafeCheckpointError` naming each
    one outside the allowlist (and the ``--trust-checkpoint`` flag); otherwise it loads with
    ``weights_only=True`` under :func:`allowed_globals`. ``trust=True`` uses ``weights_only=False``
    (arbitrary code execution: only for files from a trusted source). ``mmap`` maps the tensors of a
    zip-format file instead of reading them (a record read for its ``args`` beside an optimizer state).
    """
    path = pathlib.Path(path)
    mmap = mmap and zipfile.is_zipfile(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist; the checkpoint is incomplete or the path is wrong")
    try:
        with open(path, "rb") as handle:
            if not handle.read(1):
                raise _corrupt(path, "the file is empty")
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint file {path} ({err.strerror or err})") from None
    # the file can be opened: what torch.load fails on now is its content (a cut-off zip reads as EINVAL)
    if trust:
        try:
            return torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as err:
            raise _corrupt(path, _reason(err)) from None
    offending = scan_unsafe_globals(path)
    if offending:
        raise _refusal(path, offending)
    names = torch.serialization.get_unsafe_globals_in_checkpoint(os.fspath(path)) if offending is not None else []
    allowlist = allowed_globals() + _optional_globals(names)
    try:
        with torch.serialization.safe_globals(allowlist):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        message = str(err)
        refused = re.findall(r"GLOBAL ([\w.]+)", message) + re.findall(r"Unsupported global: ([\w.]+)", message)
        if refused:
            raise _refusal(path, refused) from None
        raise _corrupt(path, _reason(err)) from None
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        raise _corrupt(path, _reason(err)) from None


def _reason(error: BaseException) -> str:
    """The part of a torch.load failure that says what was wrong with the bytes (torch's weights-only
    message wraps the unpickler's complaint in advice about allowlists that does not apply here)."""
    text = str(error).strip()
    inner = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    if inner:
        text = inner.group(1)
    first = text.splitlines()[0].split(". ")[0] if text else type(error).__name__
    return first[:200]


def _corrupt(path: pathlib.Path, reason: str) -> CheckpointError:
    return CheckpointError(f"{path}: corrupt or truncated checkpoint file ({reason}); copy it again from where the "
                           "run saved it, or load another iteration")
