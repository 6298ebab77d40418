"""The ``procap`` command line: one subcommand per module in ``procap.commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are imported lazily so that ``procap --help`` stays fast and a command's heavy imports
(torch, cv2) are only paid when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from procap.errors import ProCapError
from procap.extras import DISTRIBUTION, missing_extra_message

# name -> module under procap.commands; the order is the order shown by --help.
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "synth": "synth",
    "vocab": "vocab",
    "prepare": "prepare",
    "vqgan": "vqgan",
    "pretrain": "pretrain",
    "train": "train",
    "evaluate": "evaluate",
    "caption": "caption",
    "imagine": "imagine",
    "procedure": "procedure",
    "convert": "convert",
    "score": "score",
    "info": "info",
    "profile": "profile",
}


def _available_commands() -> dict[str, object]:
    modules = {}
    for name, module_name in COMMANDS.items():
        try:
            modules[name] = importlib.import_module(f"procap.commands.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"procap.commands.{module_name}":
                raise
    return modules


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors on one line (``procap train: error: ...``), exit code 2, like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version_line() -> str:
    """``procap X.Y.Z (procap-torch)``: the installed distribution's version, or the source tree's."""
    from importlib import metadata

    from procap import __version__

    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = __version__
    return f"procap {version} ({DISTRIBUTION})"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="procap", description="ProCap: fast change captioning (ICLR 2026).")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _available_commands().items():
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
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
    except OSError as exc:
        if exc.filename is None:
            raise
        # A file the checks could not foresee (disk full, permissions changed while running): still one sentence.
        print(f"procap: error: cannot access {exc.filename} ({exc.strerror or exc}).", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
