"""One training per ``save`` folder: an exclusive ``flock`` on ``<save>/.train.lock``.

Two runs writing one folder would interleave checkpoints and race on ``latest``. The lock is held by
the first rank while it trains; a second run fails at once with the first one's process id. The file
is removed on release; a run that locks a file another run has just removed notices (the path no
longer names the locked file) and tries again, so two runs never both hold the lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from kerple.training.errors import TrainingError

LOCK_NAME = ".train.lock"


class SaveLock:
    """The lock of one ``save`` folder; :meth:`release` (or leaving the ``with`` block) frees it."""

    def __init__(self, save: str | os.PathLike[str]) -> None:
        self.path = Path(save) / LOCK_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise TrainingError(
                    f"another training (pid {holder}) is writing checkpoints to {save} (lock {self.path}); "
                    "two runs must not share one 'save' folder: wait for it to end, or choose another 'save'"
                ) from None
            if self.path.exists() and os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                os.ftruncate(fd, 0)
                try:
                    os.write(fd, str(os.getpid()).encode())
                except OSError:  # a full disk: the flock is the lock; its process id is only for the message
                    pass
                self._fd = fd
                return
            os.close(fd)  # the file was removed by the run that just released it: lock the new one
        raise TrainingError(f"could not lock {self.path}: it keeps being replaced")

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "SaveLock":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
