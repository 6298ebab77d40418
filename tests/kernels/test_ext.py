"""The compiled ops' loader: the cache folder's key, and every way of not getting the ops said in one sentence.

None of these compiles the real sources: a compile error comes from a one-line broken source (under a second), and
the successful compile of the package's own sources, with two processes at once, is tests/test_setup.py's.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from procap.kernels import _ext


def _ninja_found() -> bool:
    try:
        with _ext._ninja_on_path():
            return True
    except _ext.OpsUnavailable:
        return False


needs_a_compiler = pytest.mark.skipif(
    shutil.which("c++") is None or not _ninja_found(), reason="needs a C++ compiler and ninja"
)


def test_the_cache_is_keyed_by_torch_python_and_device():
    key = _ext.cache_key("2.13.0+cpu", (3, 11), "cpu")
    assert key == "torch2.13.0+cpu-py3.11-cpu"
    others = {
        _ext.cache_key("2.12.1+cpu", (3, 11), "cpu"),  # another torch: another C++ ABI
        _ext.cache_key("2.13.0+cu128", (3, 11), "cpu"),  # the same version, another build
        _ext.cache_key("2.13.0+cpu", (3, 12), "cpu"),
        _ext.cache_key("2.13.0+cpu", (3, 11), "cuda-sm90"),
    }
    assert len(others) == 4 and key not in others


def test_the_build_folder_follows_the_cache_variables_and_the_running_torch(tmp_path):
    plan = _ext.BuildPlan("cpu", (tmp_path / "a.cpp",))
    (tmp_path / "a.cpp").write_text("int a;\n")
    python = f"py{sys.version_info[0]}.{sys.version_info[1]}"
    key = f"torch{torch.__version__}-{python}-cpu"
    assert (
        _ext.build_folder(plan, {"PROCAP_CACHE": str(tmp_path / "c")}) == tmp_path / "c" / "ext" / key / plan.digest()
    )
    assert _ext.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "procap"
    assert _ext.cache_root({"PROCAP_CACHE": "/x", "XDG_CACHE_HOME": "/y"}) == Path("/x")
    assert _ext.cache_root({}) == Path.home() / ".cache" / "procap"
    # changed sources build into a new folder: a cached library is never one of other sources
    digest = plan.digest()
    (tmp_path / "a.cpp").write_text("int b;\n")
    assert plan.digest() != digest


def test_cuda_builds_are_named_by_their_architectures():
    assert _ext.cuda_archs({"TORCH_CUDA_ARCH_LIST": "8.0;9.0+PTX"}) == "sm80_sm90PTX"
    assert _ext.cuda_archs({"TORCH_CUDA_ARCH_LIST": "9.0a"}) == "sm90a"
    assert _ext.plan_build({"PROCAP_SKIP_CUDA_BUILD": "1"}).device_kind == "cpu"


def test_the_package_compiles_its_own_sources():
    plan = _ext.plan_build({"PROCAP_SKIP_CUDA_BUILD": "1"})
    assert {source.name for source in plan.sources} >= {"module.cpp", "masking_cpu.cpp", "vq_cpu.cpp"}
    assert all(source.is_file() and source.parent == _ext.SOURCES for source in plan.sources)


def test_an_install_without_sources_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(_ext, "SOURCES", tmp_path / "csrc")
    with pytest.raises(_ext.OpsUnavailable, match=r"this install has no C\+\+ sources"):
        _ext.plan_build({})


def test_skipping_needs_no_compiler(monkeypatch):
    monkeypatch.setenv("PROCAP_SKIP_EXT", "1")
    monkeypatch.setattr(_ext, "plan_build", None)  # not even looked at
    assert _ext._find_and_load() == "PROCAP_SKIP_EXT=1"


def _broken_plan(tmp_path: Path) -> _ext.BuildPlan:
    (tmp_path / "broken.cpp").write_text("#error deliberately broken\n")
    return _ext.BuildPlan("cpu", (tmp_path / "broken.cpp",))


def test_no_compiler_or_no_ninja_is_one_sentence(tmp_path, monkeypatch):
    plan = _broken_plan(tmp_path)
    environ = {"PROCAP_CACHE": str(tmp_path / "cache"), "CXX": "/nonexistent/c++"}
    with pytest.raises(_ext.OpsUnavailable, match=r"^no C\+\+ compiler \('/nonexistent/c\+\+' is not found; "):
        _ext.compile_and_load(plan, environ)
    monkeypatch.setattr(_ext.shutil, "which", lambda name: None if name == "ninja" else "/usr/bin/" + name)
    monkeypatch.setitem(sys.modules, "ninja", None)  # nor the ninja package
    with pytest.raises(_ext.OpsUnavailable, match=r"^ninja, which torch compiles with, is not installed"):
        _ext.compile_and_load(plan, {**environ, "CXX": "c++"})


@needs_a_compiler
def test_a_compile_error_is_one_line_and_not_paid_again(tmp_path, monkeypatch):
    plan = _broken_plan(tmp_path)
    environ = {"PROCAP_CACHE": str(tmp_path / "cache")}
    folder = _ext.build_folder(plan, environ)
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")  # torch's lock file as a killed compile leaves it: torch alone would wait forever
    with pytest.raises(_ext.OpsUnavailable) as failed:
        _ext.compile_and_load(plan, environ)
    reason = str(failed.value)
    assert reason.startswith("the compile failed: ") and "error: #error deliberately broken" in reason
    assert "\n" not in reason and (folder / "failed.log").is_file() and not (folder / "built.json").exists()

    def compile_again(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(_ext, "_compile", compile_again)
    with pytest.raises(_ext.OpsUnavailable, match=r"^an earlier compile with c\+\+ failed \(the compile failed: .*"):
        _ext.compile_and_load(plan, environ)  # the same compiler: the recorded failure, at once
    with pytest.raises(AssertionError, match="compiled again"):
        _ext.compile_and_load(plan, {**environ, "CXX": "g++"})  # another compiler gets its own try


def test_a_damaged_cached_library_is_one_sentence_naming_the_folder(tmp_path):
    plan = _broken_plan(tmp_path)
    environ = {"PROCAP_CACHE": str(tmp_path / "cache")}
    folder = _ext.build_folder(plan, environ)
    folder.mkdir(parents=True)
    (folder / "built.json").write_text("{}")
    (folder / "procap_ops.so").write_bytes(b"not a shared library")
    with pytest.raises(
        _ext.OpsUnavailable, match=rf"^the cached library .* does not load .*; delete {re.escape(str(folder))} to"
    ):
        _ext.compile_and_load(plan, environ)
