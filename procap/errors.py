"""User-facing errors: one clear sentence, mapped to exit code 2 by the CLI."""


class ProCapError(Exception):
    """Bad input from the user (missing path, malformed file, unknown preset...).

    The message is a single sentence that names the offending file or argument. The CLI prints it
    as ``procap: error: <message>`` and exits with code 2.
    """
