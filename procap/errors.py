"""User-facing errors: one clear sentence, mapped to exit code 2 by the CLI."""


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
