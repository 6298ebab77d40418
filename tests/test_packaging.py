"""The distribution: its name on PyPI, the extras split, `procap --version`, missing extras named in one sentence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from procap.cli import main
from procap.errors import ProCapError
from procap.extras import DISTRIBUTION, EXTRA_OF_MODULE, missing_extra_message, require

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml without a package")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_distribution_is_not_the_unrelated_procap_and_keeps_the_command():
    assert PROJECT["name"] == DISTRIBUTION == "procap-torch"
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"] == {"procap": "procap.cli:main"}
    assert (ROOT / "procap" / "py.typed").is_file()


def test_the_core_is_lean_and_every_extra_of_the_table_exists():
    core = {dep.split(">")[0].split(";")[0].split("=")[0].strip() for dep in PROJECT["dependencies"]}
    assert core == {"torch", "triton", "numpy", "pillow", "safetensors", "tqdm"}
    extras = PROJECT["optional-dependencies"]
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)
    assert {"train", "eval", "hub", "bench", "test", "all"} <= set(extras)
    # The test extra pulls every extra the tests import (CI installs only `.[test]`).
    assert any(dep.startswith(f"{DISTRIBUTION}[") and "train" in dep and "hub" in dep for dep in extras["test"])


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("procap 0.")


def test_a_missing_extra_is_one_sentence_naming_it(monkeypatch, capsys, tmp_path):
    prepare_argv = ["prepare", "--dataset", "clevr-change", "--root", str(tmp_path / "data"), "--vqgan", "v"]
    prepare_argv += ["--out", str(tmp_path / "cache")]  # beside the dataset: an --out inside --root is refused
    assert missing_extra_message("h5py.highlevel") == (
        "this needs the optional package h5py, from the [train] extra: pip install 'procap-torch[train]'."
    )
    assert missing_extra_message("numpy") is None  # core: a real bug, not a missing extra
    monkeypatch.setitem(sys.modules, "pycocoevalcap", None)
    with pytest.raises(ProCapError, match=r"caption metrics needs .* \[eval\] extra"):
        require("pycocoevalcap", "caption metrics")
    # Through the CLI: a command whose import of an extra's package fails exits 2 with one line, no traceback.
    from procap.commands import prepare

    def needs_cv2(args):
        raise ModuleNotFoundError("No module named 'cv2'", name="cv2")

    monkeypatch.setattr(prepare, "run", needs_cv2)
    capsys.readouterr()
    code = main(prepare_argv)
    err = capsys.readouterr().err.strip().splitlines()
    expected = (
        "procap prepare needs the optional package cv2, from the [train] extra: pip install 'procap-torch[train]'."
    )
    assert code == 2 and err == [f"procap: error: {expected}"]

    def needs_numpy(args):  # a core module missing is a broken install: the error is not hidden
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")

    monkeypatch.setattr(prepare, "run", needs_numpy)
    with pytest.raises(ModuleNotFoundError):
        main(prepare_argv)
