"""The distribution: its name on PyPI, the extras split, a core without triton, `procap --version`, missing extras
named in one sentence."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import procap
from procap.commands.cli import main
from procap.core.errors import ProCapError
from procap.core.extras import DISTRIBUTION, EXTRA_OF_MODULE, missing_extra_message, require
from tests.support import subprocess_env

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml without a package")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def test_the_distribution_is_not_the_unrelated_procap_and_keeps_the_command():
    assert PROJECT["name"] == DISTRIBUTION == "procap-torch"
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"] == {
        "procap": "procap.commands.cli:main"
    }
    assert (ROOT / "procap" / "py.typed").is_file()


def test_the_core_is_lean_and_every_extra_of_the_table_exists():
    core = {dep.split(">")[0].split(";")[0].split("=")[0].strip() for dep in PROJECT["dependencies"]}
    # No triton (about 1 GB): CUDA builds of torch bring it; test_kernels_and_captioning_without_triton checks the rest.
    # ninja: what torch compiles the C++ ops with on first use.
    assert core == {"torch", "numpy", "pillow", "safetensors", "tqdm", "ninja"}
    extras = PROJECT["optional-dependencies"]
    assert any(dep.startswith("triton") for dep in extras["test"])  # CI runs the Triton kernels interpreted
    assert set(EXTRA_OF_MODULE.values()) <= set(extras)
    assert {"train", "eval", "hub", "bench", "test", "all"} <= set(extras)
    # The test extra pulls every extra the tests import (CI installs only `.[test]`).
    assert any(dep.startswith(f"{DISTRIBUTION}[") and "train" in dep and "hub" in dep for dep in extras["test"])


def test_version_flag(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"procap {procap.__version__} ({DISTRIBUTION})\n"


def test_the_version_is_written_once():
    """pyproject.toml has no version of its own: setuptools reads procap/_version.py, the file procap.__version__
    comes from, so the distribution's metadata and the package cannot disagree."""
    from setuptools.config.expand import read_attr

    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    source = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert source == "procap._version.__version__"
    assert read_attr(source, root_dir=str(ROOT)) == procap.__version__  # what a build of this tree records
    assert procap.__version__ is procap._version.__version__
    assigned = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "procap").rglob("*.py"))
        if re.search(r"^__version__\s*=", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    ]
    assert assigned == ["procap/_version.py"]


def test_the_version_is_answered_without_importing_torch():
    # Building the parser imports every command and torch with them (2.5-3 s); --version must not pay for that.
    probe = "import sys; from procap.commands.cli import main; main(['--version']); print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('procap.commands')))"
    env = subprocess_env()
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    version, imported = done.stdout.strip().splitlines()
    # the entry point lives in the commands package; no subcommand's module is loaded
    assert version.startswith("procap 0.") and imported == "['procap.commands', 'procap.commands.cli']"


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


# Run in a fresh interpreter, "without" or "with" triton. The interpreter switch and PROCAP_KERNELS=triton are set by
# the test, so that the dispatch would choose Triton for every op it can, on CPU and CUDA inputs alike.
_DISPATCH_AND_CAPTION = """
import json, sys
if sys.argv[1] == "without":
    sys.modules["triton"] = None  # `import triton` raises ModuleNotFoundError, as on an install without it
import torch
from procap.kernels import dispatch

choices = {
    f"{name} {device} {dtype} grad={grad}": dispatch.chosen_impl(name, device, dtype, grad)
    for name in sorted(dispatch._OPS)
    for device in ("cpu", "cuda")  # chosen without a GPU: only which implementations exist is asked
    for dtype in dispatch.FUSED_DTYPES
    for grad in (False, True)
}
captions = None
if sys.argv[1] == "without":
    from procap.data import Vocabulary
    from procap.fast import Captioner
    from procap.model.procap import ProCap
    from tests.conftest import VOCAB_SIZE, tiny_config

    torch.manual_seed(0)
    vocab = Vocabulary.build([" ".join(f"word{i}" for i in range(VOCAB_SIZE - 8))])
    captioner = Captioner(ProCap(tiny_config()).eval(), vocab, device="cpu", max_len=6, batch_sizes=(2,))
    captions = captioner(torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32))
print(json.dumps({"triton": dispatch.triton is not None, "ops": sorted(dispatch._OPS), "choices": choices,
                  "captions": captions}))
"""


def _dispatch_and_caption(triton: str) -> dict:
    env = os.environ | {"TRITON_INTERPRET": "1", "PROCAP_KERNELS": "triton"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])  # this checkout and its tests/
    done = subprocess.run(
        [sys.executable, "-c", _DISPATCH_AND_CAPTION, triton],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_and_captioning_without_triton():
    """The core install has no triton: procap.kernels imports, no op picks Triton, and a Captioner captions on CPU."""
    without = _dispatch_and_caption("without")
    assert not without["triton"]
    assert {"masking", "vq_nearest", "group_norm", "bias_add", "add_layer_norm", "greedy_step"} <= set(without["ops"])
    assert len(without["choices"]) == len(without["ops"]) * 2 * 3 * 2
    assert not {key: impl for key, impl in without["choices"].items() if impl == "triton"}
    assert set(without["choices"].values()) <= {"reference", "cpp", "cuda"}
    captions = without["captions"]
    assert len(captions) == 2 and all(isinstance(caption, str) for caption in captions)


def test_the_same_dispatch_picks_triton_where_it_is_installed():
    """The control for the test above: with triton importable these settings do choose it, so blocking it counted."""
    pytest.importorskip("triton", reason="triton is not installed here: the run above is this machine's only case")
    with_triton = _dispatch_and_caption("with")
    assert with_triton["triton"]
    assert all(
        with_triton["choices"][f"{name} cuda torch.float32 grad=False"] == "triton" for name in with_triton["ops"]
    )
