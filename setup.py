"""Build script: the Python package plus the optional C++/CUDA extension (csrc/) as ``procap.kernels._C``.

The C++ (CPU) ops build on any machine with a C++ compiler and torch importable at build time
(``pip install -e . --no-build-isolation``). The CUDA sources (csrc/cuda/*.cu) are added only when torch is a
CUDA build and nvcc is found. ``PROCAP_SKIP_EXT=1`` skips the extension entirely, ``PROCAP_SKIP_CUDA_BUILD=1`` its
CUDA half.

The extension is optional, whatever fails: a CUDA compile error retries with the C++ ops alone, and a C++ compile
error installs the package without the extension (``procap.kernels`` then uses Triton or the PyTorch references);
either is announced in the build output and the install succeeds. (setuptools' own ``optional=True`` does not cover
this: torch's ninja build raises ``RuntimeError``, which setuptools lets through.) Without a visible GPU, and without
``TORCH_CUDA_ARCH_LIST``, the CUDA code is built for :data:`DEFAULT_CUDA_ARCHS` (torch's own detection fails there).
"""

from __future__ import annotations

import glob
import os
import subprocess
from collections.abc import Mapping

from setuptools import find_packages, setup
from setuptools.errors import BaseError, CCompilerError, CompileError

# A100; A40 / A10 / RTX 30xx; H100 / H200, plus PTX that newer GPUs compile at load time.
DEFAULT_CUDA_ARCHS = "8.0;8.6;9.0+PTX"
CXX_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]  # no FMA contraction: round like the reference
BUILD_ERRORS = (BaseError, CCompilerError, CompileError, RuntimeError, OSError, subprocess.CalledProcessError)


def default_cuda_arch_list(environ: Mapping[str, str], visible_gpus: int) -> str | None:
    """The arch list to set for a CUDA build, or None to leave torch's choice (a set variable or visible GPUs).

    torch derives the list from the visible GPUs when ``TORCH_CUDA_ARCH_LIST`` is unset and indexes an empty list
    (IndexError) when there are none, e.g. building in a container or on a login node.
    """
    if environ.get("TORCH_CUDA_ARCH_LIST") or visible_gpus > 0:
        return None
    return DEFAULT_CUDA_ARCHS


def without_cuda(ext) -> bool:
    """Drop the CUDA sources and the CUDA macro from ``ext`` (in place); True if there was anything to drop."""
    cuda_sources = [s for s in ext.sources if s.endswith(".cu")]
    if not cuda_sources:
        return False
    ext.sources = [s for s in ext.sources if not s.endswith(".cu")]
    args = ext.extra_compile_args
    if isinstance(args, dict):
        args.pop("nvcc", None)
        args["cxx"] = [a for a in args.get("cxx", []) if a != "-DPROCAP_WITH_CUDA"]
    return True


def _optional_build_ext(base: type) -> type:
    """torch's ``BuildExtension`` made optional for real: a failure never aborts the install."""

    class OptionalBuildExtension(base):
        def build_extension(self, ext) -> None:
            try:
                super().build_extension(ext)
                return
            except BUILD_ERRORS as exc:
                reason = " ".join(str(exc).split())[-400:]
                if not without_cuda(ext):
                    print(
                        f"procap: WARNING: the C++ extension {ext.name} failed to build ({reason}). procap is "
                        "installed without it: procap.kernels uses Triton on CUDA and the PyTorch references on CPU."
                    )
                    return
                print(f"procap: WARNING: the CUDA part of {ext.name} failed to build ({reason}); retrying C++ only.")
            self.build_extension(ext)

    return OptionalBuildExtension


def _extension_setup() -> dict:
    """``ext_modules`` and ``cmdclass`` for the extension, or nothing when skipped or torch is missing."""
    if os.environ.get("PROCAP_SKIP_EXT", "0") == "1":
        print("procap: PROCAP_SKIP_EXT=1, not building the C++/CUDA extension")
        return {}
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        print("procap: torch is not importable at build time (use --no-build-isolation); skipping the extension")
        return {}
    sources = sorted(glob.glob("csrc/*.cpp"))
    extra = {"cxx": list(CXX_FLAGS)}
    extension_cls = cpp_extension.CppExtension
    with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    with_cuda = with_cuda and os.environ.get("PROCAP_SKIP_CUDA_BUILD", "0") != "1"
    if with_cuda:
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        extra["nvcc"] = ["-O3"]  # no --use_fast_math: distances must round like the fp32 reference
        extra["cxx"] = CXX_FLAGS + ["-DPROCAP_WITH_CUDA"]
        extension_cls = cpp_extension.CUDAExtension
        archs = default_cuda_arch_list(os.environ, torch.cuda.device_count())
        if archs:
            os.environ["TORCH_CUDA_ARCH_LIST"] = archs
            print(f"procap: no GPU visible and TORCH_CUDA_ARCH_LIST unset: building CUDA code for {archs}")
    print(f"procap: building procap.kernels._C from {len(sources)} sources (CUDA: {with_cuda})")
    ext = extension_cls(
        "procap.kernels._C", sources, extra_compile_args=extra, extra_link_args=["-fopenmp"], optional=True
    )
    build_ext = _optional_build_ext(cpp_extension.BuildExtension).with_options(use_ninja=True)
    return {"ext_modules": [ext], "cmdclass": {"build_ext": build_ext}}


if __name__ == "__main__":  # also under pip: setuptools' build backend runs this file as __main__
    packages = [p for p in find_packages(include=["procap", "procap.*"]) if not p.startswith("procap.kernels")]
    packages += ["procap.kernels"] + [f"procap.kernels.{p}" for p in find_packages("kernels")]
    setup(
        packages=packages,
        package_dir={"procap.kernels": "kernels"},
        package_data={
            "procap": ["py.typed"],  # PEP 561: the package ships its type hints
            "procap.assets": ["*.safetensors"],  # the demo's embedded tokenizer
        },
        **_extension_setup(),
    )
