"""Guards of a training run: one writer per run folder, and Ctrl-C / SIGTERM turned into a clean save.

:class:`RunFolderLock` holds an exclusive ``flock`` on the run folder itself while a run writes into it, so a
second ``procap train --out`` on the same folder stops with one sentence instead of interleaving its log and
checkpoints with the first. The kernel drops the lock when the process dies, so a killed run leaves no stale
lock behind.

:class:`StopRequests` catches SIGINT and SIGTERM and only records them; the training loop finishes the step in
flight, saves ``last`` and stops (:class:`TrainingInterrupted`). A second Ctrl-C stops at once, unsaved.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from typing_extensions import Self

from procap.errors import ProCapError
from procap.files import try_exclusive_flock


class RunFolderLock:
    """Exclusive, non-blocking lock on a folder (``flock`` on the folder's own descriptor; no lock file).

    Args:
        folder: an existing folder.
        flag: how messages name it (``--out``).

    Raises:
        ProCapError: another process holds the lock.
    """

    def __init__(self, folder: str | os.PathLike, flag: str = "--out") -> None:
        self.folder, self.flag = Path(folder), flag
        self._fd: int | None = None

    def __enter__(self) -> Self:
        fd = os.open(self.folder, os.O_RDONLY)
        if not try_exclusive_flock(fd):
            os.close(fd)
            raise ProCapError(
                f"{self.flag} {self.folder} is in use by another procap run; wait for it to finish "
                "or choose another folder."
            )
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C or SIGTERM after saving; ``signum`` is the signal (exit code 128 + signum)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class StopRequests:
    """While active (main thread only), SIGINT and SIGTERM set :attr:`signum` instead of stopping the process.

    A second SIGINT raises ``KeyboardInterrupt`` at once, for a run that does not reach its next step.
    Previous handlers are restored on exit. In other threads this is a no-op (Python delivers signals to the
    main thread only).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
