"""User-facing errors: one clear sentence, mapped to exit code 2 by the CLI."""

import reprlib

# A message shows at most this much of a value it quotes.
SHOWN_CHARS = 40

# Built to a bounded size: repr() of a YAML alias bomb (a small file whose aliases nest lists in lists) is exponential
# in the file's size, and ``f"{value!r:.40}"`` cuts the text only after building all of it.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxlist = _SHORT_REPR.maxtuple = _SHORT_REPR.maxset = _SHORT_REPR.maxfrozenset = 4
_SHORT_REPR.maxdict = 4
_SHORT_REPR.maxstring = _SHORT_REPR.maxlong = _SHORT_REPR.maxother = SHOWN_CHARS


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters, built in time and memory that do not grow with
    ``value`` (a value from a file or the Python API may be of any size)."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProCapError(Exception):
    """Bad input from the user (missing path, malformed file, unknown preset...).

    The message is a single sentence that names the offending file or argument. The CLI prints it
    as ``procap: error: <message>`` and exits with code 2.
    """


class ProCapWarning(UserWarning):
    """Something the user should know that does not stop the work; the CLI prints it as one line,
    ``procap: warning: <message>``, on stderr."""


class OutOfDomainWarning(ProCapWarning):
    """The images given to a model are far from those it was trained on (:mod:`procap.data.domain`), so its
    captions of them are not to be trusted."""
