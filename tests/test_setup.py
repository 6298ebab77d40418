"""setup.py and the sdist: the extension build is optional for real (every failure installs without it), a CUDA build
without a visible GPU gets an arch list, and the sdist carries every source and installs into a fresh venv."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from setuptools import Extension

ROOT = Path(__file__).resolve().parents[1]


def _setup_module():
    spec = importlib.util.spec_from_file_location("procap_setup_script", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: defines the helpers without calling setup()
    return module


def test_failed_extension_build_still_installs(tmp_path):
    # A source that cannot compile: torch's ninja build raises RuntimeError, which used to abort the install.
    shutil.copy(ROOT / "setup.py", tmp_path)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "broken.cpp").write_text("#error deliberately broken\n")
    done = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "failed to build" in done.stdout and "installed without the C++ extension" in done.stdout
    assert not list((tmp_path / "kernels").glob("_C*.so"))


def test_arch_list_without_a_visible_gpu():
    setup = _setup_module()
    assert setup.default_cuda_arch_list({}, visible_gpus=0) == setup.DEFAULT_CUDA_ARCHS
    assert "9.0" in setup.DEFAULT_CUDA_ARCHS  # H100
    assert setup.default_cuda_arch_list({"TORCH_CUDA_ARCH_LIST": "8.9"}, visible_gpus=0) is None
    assert setup.default_cuda_arch_list({}, visible_gpus=1) is None  # torch detects the visible GPU


def test_cuda_failure_retries_without_cuda_sources():
    setup = _setup_module()
    ext = Extension(
        "procap.kernels._C",
        ["csrc/a.cpp", "csrc/cuda/b.cu"],
        extra_compile_args={"cxx": ["-O3", "-DPROCAP_WITH_CUDA"], "nvcc": ["-O3"]},
    )
    assert setup.without_cuda(ext)
    assert ext.sources == ["csrc/a.cpp"] and ext.extra_compile_args == {"cxx": ["-O3"]}
    assert not setup.without_cuda(ext)  # nothing left to drop: the next failure skips the extension


class _BuildThatFails:
    """Stands in for torch's BuildExtension: ``build_extensions`` loops over ``build_extension``, which raises."""

    def __init__(self, extensions, error: Exception, fail_before_cuda: bool = False):
        self.extensions = extensions
        self.error = error
        self.fail_before_cuda = fail_before_cuda  # like torch's nvcc check, which runs before any extension
        self.attempts: list[list[str]] = []

    def build_extensions(self) -> None:
        if self.fail_before_cuda and any(s.endswith(".cu") for ext in self.extensions for s in ext.sources):
            raise self.error
        for ext in self.extensions:
            self.build_extension(ext)

    def build_extension(self, ext) -> None:
        self.attempts.append(list(ext.sources))
        if not self.fail_before_cuda:
            raise self.error


@pytest.mark.parametrize(
    "error",
    [
        AssertionError("At least one source is required to build a library"),  # an sdist without csrc/
        AssertionError(),  # no message: the warning still names the failure
        RuntimeError("Error compiling objects for extension"),  # torch's ninja build
        FileNotFoundError("nvcc not found"),
        ValueError("Unknown CUDA arch (7.2) or GPU not supported"),
        ImportError("cannot import name 'X'"),
    ],
    ids=lambda error: type(error).__name__ + ("" if str(error) else "-bare"),
)
def test_every_build_failure_installs_without_the_extension(error, capsys):
    setup = _setup_module()
    build = setup._optional_build_ext(_BuildThatFails)([Extension("procap.kernels._C", ["csrc/a.cpp"])], error)
    build.build_extensions()  # does not raise
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("procap: WARNING: the C++ extension procap.kernels._C failed")
    assert type(error).__name__ in lines[0] and "installed without the C++ extension" in lines[0]


def test_cuda_failure_at_either_stage_retries_cpp_only(capsys):
    setup = _setup_module()
    for fail_before_cuda in (False, True):  # in one extension's compile, or in torch's nvcc check before any
        ext = Extension("procap.kernels._C", ["csrc/a.cpp", "csrc/cuda/b.cu"])
        build = setup._optional_build_ext(_BuildThatFails)([ext], RuntimeError("nvcc failed"), fail_before_cuda)
        build.build_extensions()
        out = capsys.readouterr().out
        assert (
            "the CUDA part of procap.kernels._C failed to build (RuntimeError: nvcc failed); retrying C++ only" in out
        )
        assert build.attempts[-1] == ["csrc/a.cpp"]
        # A compile that fails again without CUDA installs without the extension; the nvcc check passes then.
        assert ("installed without the C++ extension" in out) is not fail_before_cuda


def test_no_sources_or_no_torch_at_build_time_installs_without_the_extension(tmp_path, monkeypatch, capsys):
    setup = _setup_module()
    monkeypatch.chdir(tmp_path)  # no csrc/ here: torch would refuse the empty source list with an AssertionError
    assert setup._extension_setup() == {}
    assert "no C++ sources in csrc/" in capsys.readouterr().out

    def torch_fails(error):
        def set_up():
            raise error

        return set_up

    monkeypatch.setattr(setup, "_torch_extension_setup", torch_fails(ImportError("No module named 'torch'")))
    assert setup._extension_setup() == {}
    out = capsys.readouterr().out
    assert "torch is not importable at build time (ImportError: No module named 'torch')" in out
    monkeypatch.setattr(setup, "_torch_extension_setup", torch_fails(OSError("libcudnn.so.9: cannot open")))
    assert setup._extension_setup() == {}
    assert "cannot be set up (OSError: libcudnn.so.9: cannot open)" in capsys.readouterr().out


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


def _build_sdist(source: Path, out: Path) -> Path:
    if importlib.util.find_spec("build") is not None:
        command = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out)]
    else:  # the `build` package comes with the [test] extra; setuptools alone makes the same sdist
        command = [sys.executable, "setup.py", "sdist", "--dist-dir", str(out)]
    done = subprocess.run(command, cwd=source, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("procap_torch-*.tar.gz")
    return sdist


def test_sdist_carries_every_source_and_installs_with_or_without_the_extension(tmp_path):
    # 80-145 s on this shared 2-core machine (no GPU), most of it compiling the C++ ops in the install.
    checkout = _copy_of_the_checkout(tmp_path / "checkout")
    sdist = _build_sdist(checkout, tmp_path / "dist")
    with tarfile.open(sdist) as archive:
        shipped = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    csrc = {path.relative_to(checkout).as_posix() for path in (checkout / "csrc").rglob("*") if path.is_file()}
    assert any(name.endswith(".cpp") for name in csrc) and any(name.startswith("csrc/cuda/") for name in csrc)
    # Every source, header and CUDA file, although this machine's torch may be a CPU build.
    assert csrc <= shipped, sorted(csrc - shipped)
    assert {"setup.py", "MANIFEST.in", "CHANGELOG.md", "kernels/__init__.py", "kernels/dispatch.py"} <= shipped
    assert {"procap/py.typed", "procap/assets/demo_tokenizer.safetensors"} <= shipped
    assert not [name for name in shipped if name.endswith((".so", ".pyc"))]

    venv = tmp_path / "venv"
    # No pip of its own: ensurepip would bring its bundled setuptools (65 on Python 3.11), which cannot build a wheel
    # without the `wheel` package; pip and setuptools come from this environment, as the README's install uses them.
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:  # run from a virtualenv (a GPU image's python3 is one): the new venv's system
        # site is the base interpreter's, without this one's torch; a .pth file adds this environment's packages
        (site_dir,) = (venv / "lib").glob("python*/site-packages")
        (site_dir / "parent_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # The sdist, not this checkout: no PYTHONPATH, and the extension is wanted (PROCAP_SKIP_EXT would skip it).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROCAP_SKIP_EXT", "PIP_REQUIRE_VIRTUALENV")}
    install = [str(python), "-m", "pip", "install", "-v", "--no-index", "--no-build-isolation", "--no-deps", str(sdist)]
    done = subprocess.run(install, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    build_output = done.stdout + done.stderr
    assert done.returncode == 0, build_output[-4000:]

    check = (
        "import importlib.resources, json, procap, procap.kernels._ext as ext; "
        "asset = importlib.resources.files('procap.assets').joinpath('demo_tokenizer.safetensors'); "
        "print(json.dumps([procap.__file__, ext.AVAILABLE, ext.LOAD_ERROR, asset.is_file()]))"
    )
    loaded = subprocess.run(
        [str(python), "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    package_file, available, load_error, has_asset = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert Path(package_file).is_relative_to(venv) and has_asset
    fallback = [line.strip() for line in build_output.splitlines() if "procap: WARNING:" in line]
    assert available or fallback, (
        f"extension not loaded ({load_error}) and no fallback warning:\n{build_output[-3000:]}"
    )
