"""The distribution whoever builds it: a pure-Python wheel that carries the C++/CUDA sources, and an install (from the
sdist, into a fresh venv) whose ops are compiled on first use, once for two processes at once, or whose one sentence
says why not.

One compile in this module (about a minute on 2 cores), into a cache folder of its own: the point is the installed
package compiling, not the cache the rest of the suite loads from.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _copy_of_the_checkout(destination: Path) -> Path:
    """The files a fresh clone has (tracked, plus new files not ignored): no build outputs, no built extension."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip("needs a git checkout to copy the project's own files")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source, target = ROOT / name, destination / name
        if not source.is_symlink() and not source.is_file():  # deleted in the working tree
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)  # procap/kernels stays a link to ../kernels
    return destination


def _build(source: Path, out: Path) -> tuple[Path, Path]:
    """``python -m build``: the sdist, then the wheel built from it; torch is not importable meanwhile, as in an
    isolated build, so the wheel cannot depend on the torch of the machine that makes it."""
    pytest.importorskip("build", reason="the [test] extra brings the build package")
    blocker = out.parent / "no-torch"
    blocker.mkdir()
    (blocker / "torch.py").write_text("raise ImportError('torch is not importable while the wheel is built')\n")
    env = os.environ | {"PYTHONPATH": str(blocker)}
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out)]  # no network: no isolation
    done = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("procap_torch-*.tar.gz")
    (wheel,) = out.glob("procap_torch-*.whl")
    return sdist, wheel


def _fresh_venv(path: Path) -> Path:
    """A venv that sees this environment's packages (torch, ninja) but not this checkout; returns its python."""
    # No pip of its own: ensurepip would bring its bundled setuptools (65 on Python 3.11), which cannot build a wheel
    # without the `wheel` package; pip and setuptools come from this environment, as the README's install uses them.
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)], check=True, timeout=120
    )
    if sys.prefix != sys.base_prefix:  # run from a virtualenv (a GPU image's python3 is one): the new venv's system
        # site is the base interpreter's, without this one's torch; a .pth file adds this environment's packages
        (site_dir,) = (path / "lib").glob("python*/site-packages")
        (site_dir / "parent_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return path / "bin" / "python"


# Run by the installed package: the first use of two compiled ops, logged at INFO on stderr, the result on stdout.
_FIRST_USE = """
import json, logging, sys, torch
logging.basicConfig(level=logging.INFO, format="%(message)s")
import procap
from procap import kernels
from procap.core.config import MaskingConfig
from procap.kernels import _ext
from procap.model.masking import sample_mask_params
torch.manual_seed(0)
z, codebook = torch.randn(300, 16), torch.randn(40, 16)
x, tables = torch.randn(2, 8, 4), (torch.randn(4), *torch.randn(3, 2, 4).unbind(0))
params = sample_mask_params(2, 2, 2, 2, MaskingConfig())
masked = kernels.masking(x, params, *tables)
print(json.dumps({
    "package": procap.__file__,
    "error": _ext.load_error(),
    "impls": [kernels.chosen_impl(op, "cpu", torch.float32) for op in ("vq_nearest", "masking")],
    "equal": [torch.equal(kernels.vq_nearest(z, codebook), kernels.vq_nearest_ref(z, codebook)),
              all(torch.equal(a, b) for a, b in zip(masked, kernels.masking_ref(x, params, *tables)))],
}))
"""


def _first_use(python: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(python), "-c", _FIRST_USE], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finished(process: subprocess.Popen) -> tuple[dict, str]:
    out, err = process.communicate(timeout=900)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def test_the_wheel_is_pure_python_and_the_installed_sdist_compiles_its_ops_on_first_use(tmp_path):
    # About 90-150 s on this shared 2-core machine (no GPU), most of it the one compile.
    if shutil.which("c++") is None:
        pytest.skip("needs a C++ compiler: the first use would fall back (tests/kernels/test_ext.py covers that)")
    checkout = _copy_of_the_checkout(tmp_path / "checkout")
    sdist, wheel = _build(checkout, tmp_path / "dist")

    with tarfile.open(sdist) as archive:
        shipped = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    csrc = {
        path.relative_to(checkout).as_posix() for path in (checkout / "kernels" / "csrc").rglob("*") if path.is_file()
    }
    assert any(name.endswith(".cpp") for name in csrc) and any(name.startswith("kernels/csrc/cuda/") for name in csrc)
    assert csrc <= shipped, sorted(csrc - shipped)  # every C++ and CUDA source, although this torch is a CPU build
    assert {"setup.py", "MANIFEST.in", "CHANGELOG.md", "kernels/__init__.py", "kernels/dispatch.py"} <= shipped
    assert {"procap/py.typed", "procap/assets/demo_tokenizer.safetensors"} <= shipped
    assert not [name for name in shipped if name.endswith((".so", ".pyc"))]

    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name  # one wheel for every torch, Python 3 and platform
    with zipfile.ZipFile(wheel) as archive:
        packed = set(archive.namelist())
    assert {"procap/kernels/" + name.removeprefix("kernels/") for name in csrc} <= packed
    assert not [name for name in packed if name.endswith((".so", ".pyd", ".o"))]

    python = _fresh_venv(tmp_path / "venv")
    # The sdist, not this checkout: no PYTHONPATH; PROCAP_SKIP_EXT would skip the ops. The build needs no torch now,
    # so build isolation would make the same wheel; it is off only because this test has no network.
    # PROCAP_KERNELS would force an implementation: the first use is the automatic choice.
    dropped = ("PYTHONPATH", "PROCAP_SKIP_EXT", "PROCAP_KERNELS", "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    install = [str(python), "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps", str(sdist)]
    done = subprocess.run(install, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    # As in an activated environment: this one's bin (ninja) on PATH; the venv's own python runs the package.
    env |= {
        "PROCAP_CACHE": str(tmp_path / "cache"),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    }
    env.pop("CXX", None)
    first, second = _first_use(python, env, tmp_path), _first_use(python, env, tmp_path)  # two at once, empty cache
    results = [_finished(first), _finished(second)]
    for result, err in results:
        assert Path(result["package"]).is_relative_to(tmp_path / "venv"), result
        # a fall-back says why on stderr: shown with the failure
        if not (result["error"] is None and result["impls"] == ["cpp", "cpp"]):
            pytest.fail(f"the first use did not run the C++ ops: {result}\n{err[-4000:]}")
        assert result["equal"] == [True, True], result
    logs = [err for _, err in results]
    compiled = [line for err in logs for line in err.splitlines() if line.startswith("compiling procap's C++ ops")]
    assert len(compiled) == 1 and str(tmp_path / "cache" / "ext") in compiled[0], logs
    # the other process waited for that compile (the flock) and loaded its library
    assert sum("waiting for another process compiling procap's ops" in err for err in logs) == 1, logs
    assert len(list((tmp_path / "cache" / "ext").glob("*/*/procap_ops.so"))) == 1

    again, err = _finished(_first_use(python, env, tmp_path))  # a later process: from the cache, nothing compiled
    assert again["impls"] == ["cpp", "cpp"] and "compiling" not in err and "waiting" not in err

    # No compiler and nothing cached: the references, and one visible sentence (no logging set up: Python's own
    # handler of last resort shows warnings) that says why.
    env |= {"PROCAP_CACHE": str(tmp_path / "cache-2"), "CXX": "/nonexistent/c++"}
    plain = _FIRST_USE.replace('logging.basicConfig(level=logging.INFO, format="%(message)s")', "")
    done = subprocess.run(
        [str(python), "-c", plain], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fallback = json.loads(done.stdout.strip().splitlines()[-1])
    assert fallback["impls"] == ["reference", "reference"] and fallback["error"].startswith("no C++ compiler")
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("procap's compiled ops are not used: no C++ compiler"), done.stderr
