"""Guards of a training run: one writer per run folder, and Ctrl-C / SIGTERM turned into a clean save.

:class:`procap.core.files.RunFolderLock` holds an exclusive ``flock`` on the run folder itself while a run writes into
it, so a second ``procap train --out`` on the same folder stops with one sentence instead of interleaving its log and
checkpoints with the first. The kernel drops the lock when the process dies, so a killed run leaves no stale
lock behind. It lives with the other output guards in :mod:`procap.core.files`, which every layer may import
(``procap synth`` locks its benchmark folder with it).

:class:`StopRequests` catches SIGINT and SIGTERM and only records them; the training loop finishes the step in
flight, saves ``last`` and stops (:class:`TrainingInterrupted`). A second Ctrl-C stops at once, unsaved.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from typing_extensions import Self


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
