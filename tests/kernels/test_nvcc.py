"""The CUDA sources (kernels/csrc/cuda/*.cu) compile for sm_90 with nvcc, without spills; skipped where nvcc is
missing.

Device code only (``nvcc -cubin``, the flags of ``torch.utils.cpp_extension`` and ``kernels/_ext.py``): the host
half of the build is the C++ one the CPU tests already exercise. ``ptxas -v`` gives registers, spills and shared memory
per kernel instantiation; they are printed (``pytest -s``). nvcc comes from PATH, ``CUDA_HOME`` or the
``nvidia-cuda-nvcc`` wheel (``pip install nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl``).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(ROOT.glob("kernels/csrc/cuda/*.cu"))
SHARED_MEMORY_LIMIT = 227 * 1024


def _find_nvcc() -> str | None:
    candidates = [shutil.which("nvcc")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates.append("/usr/local/cuda/bin/nvcc")
    for site in {os.path.dirname(os.path.dirname(torch.__file__))}:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "bin", "nvcc")))
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_nvcc", "bin", "nvcc")))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _torch_includes(tmp: Path) -> list[str]:
    """torch's include paths; a CPU wheel lacks the one generated CUDA config header, so a stand-in is written."""
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    generated = Path(cpp_extension.include_paths()[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not generated.is_file():
        stub = tmp / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        stub.parent.mkdir(parents=True)
        stub.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")  # what a CUDA build of torch generates
        includes.append(f"-I{tmp}")
    return includes


def _nvcc(nvcc: str, source: Path, tmp: Path, extra: list[str]) -> subprocess.CompletedProcess:
    flags = ["-cubin", "-arch=sm_90", "-std=c++20", "-O3", "-Xptxas", "-v", *cpp_extension.COMMON_NVCC_FLAGS]
    cmd = [nvcc, *flags, "-DPROCAP_WITH_CUDA", *extra, str(source), "-o", str(tmp / f"{source.stem}.cubin")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)


def _resources(log: str) -> list[dict]:
    """Per kernel instantiation: name, registers, spill bytes, shared memory bytes, from ``ptxas -v``."""
    kernels = []
    for block in log.split("Compiling entry function")[1:]:
        name = re.search(r"'([^']+)'", block).group(1)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
        regs = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        kernels.append(
            {
                "name": name,
                "registers": int(regs.group(1)),
                "spill": int(spills[1]) + int(spills[2]),
                "smem": int(smem.group(1)) if smem else 0,
            }
        )
    return kernels


@pytest.fixture(scope="module")
def nvcc(tmp_path_factory) -> str:
    found = _find_nvcc()
    if found is None:
        pytest.skip("nvcc not found (PATH, CUDA_HOME, /usr/local/cuda, the nvidia-cuda-nvcc wheel)")
    probe = tmp_path_factory.mktemp("probe") / "probe.cu"
    probe.write_text("#include <cuda_runtime.h>\n__global__ void probe(float* x) { x[threadIdx.x] = 1.0f; }\n")
    done = _nvcc(found, probe, probe.parent, [])
    if done.returncode != 0:
        pytest.skip(f"{found} cannot compile a trivial kernel (incomplete toolkit?): {done.stderr[-300:]}")
    return found


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_cuda_source_compiles_for_sm90(nvcc, source, tmp_path):
    done = _nvcc(nvcc, source, tmp_path, _torch_includes(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    kernels = _resources(done.stderr + done.stdout)
    assert kernels, f"ptxas reported no kernel for {source.name}"
    for k in kernels:
        print(f"{source.name}: ...{k['name'][-60:]} regs {k['registers']} spill {k['spill']} B smem {k['smem']} B")
        assert k["spill"] == 0, k
        assert k["smem"] <= SHARED_MEMORY_LIMIT, k
