"""The ``procap`` command line: one subcommand per module in ``procap.commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; a module that
builds several commands (``training``: ``vqgan``, ``pretrain``, ``train``) defines ``subcommand(name)`` returning an
object with the three instead.
Modules are imported lazily so that ``procap --help`` stays fast and a command's heavy imports
(torch, cv2) are only paid when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import select
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import NoReturn, Protocol, TextIO, cast

from procap._version import __version__
from procap.core.errors import ProCapError, ProCapWarning
from procap.core.extras import DISTRIBUTION, missing_extra_message
from procap.core.files import WRITE_FAILURES, OutputError, os_error_in, protect_inputs
from procap.core.logs import console_logging
from procap.core.validate import output_apart

# name -> module under procap.commands; the order is the order shown by --help.
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "synth": "synth",
    "vocab": "vocab",
    "prepare": "prepare",
    "vqgan": "training",
    "pretrain": "training",
    "train": "training",
    "evaluate": "evaluate",
    "caption": "caption",
    "imagine": "imagine",
    "procedure": "procedure",
    "convert": "convert",
    "score": "score",
    "info": "info",
    "profile": "profile",
}


class Command(Protocol):
    """What the parser takes of a command: a command module, or what a module's ``subcommand(name)`` returns."""

    @property
    def HELP(self) -> str: ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _available_commands() -> dict[str, Command]:
    modules: dict[str, Command] = {}
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(f"procap.commands.{module_name}")
            # An imported module is typed ModuleType; every module named in COMMANDS keeps the contract of this
            # module's docstring (tests/commands/test_help_lines.py builds every parser, each command's tests run it).
            modules[name] = cast(Command, module.subcommand(name) if hasattr(module, "subcommand") else module)
        except ModuleNotFoundError as exc:
            if exc.name != f"procap.commands.{module_name}":
                raise
    return modules


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors on one line (``procap train: error: ...``), exit code 2, like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version_line() -> str:
    """``procap X.Y.Z (procap-torch)``: the version of the code that runs, which is also the installed
    distribution's (pyproject.toml reads it from ``procap._version``)."""
    return f"procap {__version__} ({DISTRIBUTION})"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="procap", description="ProCap: fast change captioning (ICLR 2026).")
    parser.add_argument("--version", action="version", version=version_line())
    # Before the command (`procap --quiet train ...`): one switch for every command, read before any of them runs.
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument(
        "-q", "--quiet", action="store_true", help="show only warnings and errors (results on stdout stay)"
    )
    loudness.add_argument("-v", "--verbose", action="store_true", help="also show debugging messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _available_commands().items():
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def input_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(argument, path)`` of every argument but ``--out`` whose value names an existing file or folder.

    What a command reads is whatever path it is given; deciding this here, from the parsed values, covers every
    command (and every new one) with one rule instead of a list per command.
    """
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for action in sub.choices[args.command]._actions:
        if action.dest in ("out", "help") or not hasattr(args, action.dest):
            continue
        name = max(action.option_strings, key=len) if action.option_strings else (action.metavar or action.dest)
        values = getattr(args, action.dest)
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str) or not value:
                continue
            if not os.path.exists(value) and ":" in value:  # a prefixed path such as --init-encoder clip:PATH
                value = value.split(":", 1)[1]
            if os.path.exists(value):
                found.append((name, value))
    return found


def _stdout_is_a_closed_pipe() -> bool:
    """True when the reader of our stdout has gone (``procap info clevr | head -1``); poll reports POLLERR."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # not a real file (captured output), or no poll on this system
        return False


def results_on_stdout(args: argparse.Namespace) -> str | None:
    """What the running command's stdout carries when that is the work itself (``caption``'s captions, named by its
    module's ``RESULTS_ON_STDOUT``), else ``None``: a closed stdout then loses results and is an error, where
    ``procap info ... | head -1`` ends quietly."""
    module = sys.modules.get(getattr(args._run, "__module__", ""))
    return getattr(module, "RESULTS_ON_STDOUT", None)


def _os_failure(exc: Exception, args: argparse.Namespace) -> str:
    """One sentence for an operating-system failure, naming the output being written where it can."""
    number, message = os_error_in(exc) or (0, str(exc))
    if isinstance(exc, OutputError):
        return f"cannot write {exc.filename} ({message}){f'; {exc.note}' if exc.note else ''}."
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"cannot {'write' if number in WRITE_FAILURES else 'access'} {exc.filename} ({message})."
    out = getattr(args, "out", None)
    if out:
        return f"procap {args.command} could not finish writing --out {out} ({message})."
    return f"procap {args.command} stopped on an operating-system error ({message}, errno {number})."


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Show each :class:`~procap.core.errors.ProCapWarning` as one line on stderr, ``procap: warning: <message>``, instead
    of Python's two (file, line and source); every other warning goes where it went before."""
    previous = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, ProCapWarning):
            print(f"procap: warning: {message}", file=sys.stderr, flush=True)
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def log_level(args: argparse.Namespace) -> int:
    """The ``procap`` logger's level for ``--quiet`` / ``--verbose`` / neither (:mod:`procap.core.logs`)."""
    if args.quiet:
        return logging.WARNING
    return logging.DEBUG if args.verbose else logging.INFO


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["--version"]:
        # Answered before the parser is built: building it imports every command module (torch-free, but still
        # tens of modules) for one line that needs none of them.
        print(version_line())
        return 0
    parser = build_parser()
    args = parser.parse_args(arguments)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    with console_logging(log_level(args)):
        return _run_command(parser, args)


def _run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the parsed command, answering its failures with one sentence on stderr and an exit code."""
    try:
        inputs = input_arguments(parser, args)
        if getattr(args, "out", None):
            output_apart(args.out, "--out", inputs)
        with protect_inputs(inputs), one_line_warnings():
            code = int(args._run(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, where the handlers below still apply
        return code
    except ProCapError as exc:
        print(f"procap: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # An optional package of an extra that is not installed (h5py for prepare, pycocoevalcap for scores...).
        message = missing_extra_message(exc.name or "", f"procap {args.command}")
        if message is None:
            raise
        print(f"procap: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # Training raises a KeyboardInterrupt subclass that says what it saved and carries the signal number.
        print(f"procap: interrupted{f': {exc}' if str(exc) else ''}", file=sys.stderr)
        return 128 + getattr(exc, "signum", 2)
    except Exception as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_is_a_closed_pipe():
            # stdout goes to /dev/null so that the flush at exit cannot fail again (a traceback after the message)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            lost = results_on_stdout(args)
            if lost is None:
                return 128 + signal.SIGPIPE  # quiet, as `yes | head` is: the reader took what it wanted
            print(
                f"procap: error: stdout was closed before {lost} were all written (its reader went away); "
                "give --out FILE to keep them.",
                file=sys.stderr,
            )
            return 2
        if os_error_in(exc) is None:
            raise
        # Disk full, quota, a file changed while running: one sentence, whichever library met it.
        print(f"procap: error: {_os_failure(exc, args)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
