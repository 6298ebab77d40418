"""`procap --help`, `procap COMMAND --help` and argument errors answer without importing torch (issue 41, item 5).

Each case runs in a fresh interpreter, since torch, once imported by any test, stays in this process's modules.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from procap.commands.cli import COMMANDS
from tests.support import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "cv2", "h5py")

PROBE = """
import sys
from procap.commands.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY))
print('EXIT', code, file=sys.stderr)
print('HEAVY', ','.join(heavy), file=sys.stderr)
"""


def run_cli(argv: list[str]) -> tuple[int, list[str], str]:
    env = subprocess_env()
    probe = f"HEAVY = {HEAVY!r}\n{PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    lines = done.stderr.splitlines()
    code = int(next(line for line in lines if line.startswith("EXIT ")).split()[1])
    heavy = next(line for line in lines if line.startswith("HEAVY")).split(" ", 1)[1:]
    return code, [m for m in (heavy[0].split(",") if heavy else []) if m], done.stdout + done.stderr


@pytest.mark.parametrize("argv", [["--help"], *[[name, "--help"] for name in COMMANDS]], ids=" ".join)
def test_help_does_not_import_torch(argv):
    code, heavy, output = run_cli(argv)
    assert code == 0 and "usage: procap" in output
    assert heavy == [], f"procap {' '.join(argv)} imported {heavy}"


@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-command"],
        ["train", "--no-such-flag"],
        ["train", "--steps", "many"],
        ["evaluate", "--batch-size", "many"],
        ["evaluate", "--split", "no-such-split"],
        ["score", "--dataset", "no-such-dataset"],
        ["demo", "--seed", "none"],
        ["caption", "--no-such-flag"],
    ],
    ids=" ".join,
)
def test_argument_errors_do_not_import_torch(argv):
    code, heavy, output = run_cli(argv)
    assert code == 2 and "error:" in output
    assert heavy == [], f"procap {' '.join(argv)} imported {heavy}"


def test_the_probe_sees_torch_when_it_is_imported():
    # The checks above must be able to fail: torch imported before the command line shows up in the list.
    code, heavy, _ = run_cli(["--version"])
    assert code == 0 and heavy == []
    env = subprocess_env()
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\nimport procap.data.images\n{PROBE}", "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert "HEAVY torch" in done.stderr
