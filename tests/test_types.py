"""The package ships ``py.typed``, so users' type checkers read its annotations: mypy, with the settings of
pyproject.toml's ``[tool.mypy]`` (default strictness; the bodies of unannotated functions checked too in the model,
the fast path and the kernels), finds no error in ``procap/`` and ``kernels/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mypy", reason="mypy comes with the [test] extra")


def _mypy(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *argv], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )


def test_mypy_finds_no_error_in_the_package():
    done = _mypy()  # the files and settings are pyproject.toml's
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def test_the_check_sees_an_error(tmp_path):
    """The same command on a planted mistake fails: the test above can fail."""
    planted = tmp_path / "planted.py"
    planted.write_text("from procap.core.config import get_preset\n\nget_preset(3)\n")
    done = _mypy(str(planted))
    assert done.returncode == 1 and "arg-type" in done.stdout, done.stdout + done.stderr
