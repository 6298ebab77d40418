"""Where procap's messages go: the ``procap`` logger, and the console handler of the ``procap`` command.

Library modules never print: they log through ``logging.getLogger(__name__)``, so everything they say is under the
``procap`` logger, which a program silences or routes like any other
(``logging.getLogger("procap").setLevel(logging.WARNING)``). Without any logging set up, Python shows warnings and
errors on stderr and drops the rest. Progress bars are tqdm's, switched by the ``progress`` settings, not by logging.

The ``procap`` command installs :func:`console_logging`: each message alone on one line, as the command printed it
before it logged, on stderr, except records logged with ``extra=TO_STDOUT`` (a training run's validation lines),
which go to stdout as they always did. Levels: DEBUG for details (``--verbose``), INFO for what a run reports as it
goes (the default), WARNING for what went differently from what was asked (``--quiet`` keeps these and errors).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator

LOGGER_NAME = "procap"

# extra= of a record the command line writes to stdout, where the command's results go (the rest is on stderr).
TO_STDOUT = {"console_stream": "stdout"}


class ConsoleHandler(logging.Handler):
    """Each record's message on its own line, on stderr or (``extra=TO_STDOUT``) on stdout, flushed at once.

    The streams are looked up at each record, not kept: a caller that swaps ``sys.stdout`` (a worker process sending
    its lines to a parent, a test capturing output) gets the records where it now points. Write failures (a closed
    pipe, a full disk) are raised to the caller as a print would, so the command answers them with its one sentence
    instead of the logging module's traceback.
    """

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stdout if getattr(record, "console_stream", None) == "stdout" else sys.stderr
        try:
            text = self.format(record)
        except (TypeError, ValueError):  # a message that does not fit its arguments: logging's own report
            self.handleError(record)
            return
        stream.write(text + "\n")
        stream.flush()


def start_console_logging(level: int = logging.INFO) -> Callable[[], None]:
    """Show the ``procap`` logger's records at ``level`` and above on the console; returns what puts it all back.

    The logger stops propagating meanwhile: a program that calls the command line with its own root handlers would
    otherwise show each line twice.
    """
    logger = logging.getLogger(LOGGER_NAME)
    handler = ConsoleHandler()
    previous_level, previous_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False

    def stop() -> None:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        logger.propagate = previous_propagate

    return stop


@contextlib.contextmanager
def console_logging(level: int = logging.INFO) -> Iterator[None]:
    """:func:`start_console_logging` for the duration of a block."""
    stop = start_console_logging(level)
    try:
        yield
    finally:
        stop()
