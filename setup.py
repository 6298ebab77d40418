"""Build script: the Python package plus the optional C++/CUDA extension (csrc/) as ``procap.kernels._C``.

The C++ (CPU) ops build on any machine with a C++ compiler and torch importable at build time
(``pip install -e . --no-build-isolation``). The CUDA sources (csrc/cuda/*.cu) are added only when torch is a
CUDA build and nvcc is found. ``PROCAP_SKIP_EXT=1`` skips the extension entirely, ``PROCAP_SKIP_CUDA_BUILD=1`` its
CUDA half. These choices are made where the package is built and installed: an sdist carries every source whatever
machine made it (MANIFEST.in grafts csrc/), and ``pip install procap_torch-*.tar.gz`` runs this file again on the
installing machine.

The extension is optional, whatever fails: a CUDA failure (a compile error, or torch's check that nvcc matches its
CUDA) retries with the C++ ops alone, and any other failure, from torch missing at build time to a compile error or a
source list torch refuses (``AssertionError``), installs the package without the extension (``procap.kernels`` then
uses Triton or the PyTorch references); either is announced in one ``procap: WARNING:`` line of the build output and
the install succeeds. (setuptools' own ``optional=True`` does not cover this: it lets through torch's ninja
``RuntimeError`` and everything else that is not a compiler error.) Without a visible GPU, and without
``TORCH_CUDA_ARCH_LIST``, the CUDA code is built for :data:`DEFAULT_CUDA_ARCHS` (torch's own detection fails there).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping

from setuptools import find_packages, setup

# A100; A40 / A10 / RTX 30xx; H100 / H200, plus PTX that newer GPUs compile at load time.
DEFAULT_CUDA_ARCHS = "8.0;8.6;9.0+PTX"
CXX_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]  # no FMA contraction: round like the reference
WITHOUT_EXTENSION = (
    "procap is installed without the C++ extension: procap.kernels runs Triton (where installed) on CUDA and the "
    "PyTorch references elsewhere."
)


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


def failure_reason(exc: BaseException) -> str:
    """The exception on one line, its type first (a bare ``AssertionError()`` has no message), at most ~400 chars."""
    message = " ".join(str(exc).split())[-400:]
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def built_without_message(ext_name: str, reason: str) -> str:
    return f"procap: WARNING: the C++ extension {ext_name} failed to build ({reason}). {WITHOUT_EXTENSION}"


def retrying_without_cuda_message(ext_names: list[str], reason: str) -> str:
    return f"procap: WARNING: the CUDA part of {', '.join(ext_names)} failed to build ({reason}); retrying C++ only."


def _optional_build_ext(base: type) -> type:
    """torch's ``BuildExtension`` made optional for real: a failure never aborts the install.

    ``Exception`` is caught on purpose, not a list of build errors: torch raises ``RuntimeError`` (ninja),
    ``AssertionError`` (no sources), ``OSError`` / ``FileNotFoundError`` (no CUDA_HOME, no nvcc), ``ValueError``
    (an unknown arch); nothing a build raises should cost the user the pure Python install. Ctrl-C still stops it.
    """

    class OptionalBuildExtension(base):
        def build_extensions(self) -> None:
            # torch checks the compiler ABI and that nvcc matches its CUDA here, before any extension compiles;
            # a failure inside one extension's build is handled by build_extension below.
            try:
                super().build_extensions()
            except Exception as exc:  # noqa: BLE001 - whatever fails, the install goes on (see the docstring)
                reason = failure_reason(exc)
                dropped_cuda = [ext.name for ext in self.extensions if without_cuda(ext)]
                if dropped_cuda:
                    print(retrying_without_cuda_message(dropped_cuda, reason))
                    self.build_extensions()
                    return
                for ext in self.extensions:
                    print(built_without_message(ext.name, reason))

        def build_extension(self, ext) -> None:
            try:
                super().build_extension(ext)
                return
            except Exception as exc:  # noqa: BLE001 - whatever fails, the install goes on (see the docstring)
                reason = failure_reason(exc)
                if not without_cuda(ext):
                    print(built_without_message(ext.name, reason))
                    return
                print(retrying_without_cuda_message([ext.name], reason))
            self.build_extension(ext)

    return OptionalBuildExtension


def _torch_extension_setup() -> dict:
    """``ext_modules`` and ``cmdclass`` for the extension, with CUDA when this machine's torch and nvcc can build it."""
    import torch
    from torch.utils import cpp_extension

    sources = sorted(glob.glob("csrc/*.cpp"))
    if not sources:
        print(f"procap: WARNING: no C++ sources in csrc/ (an incomplete source tree?). {WITHOUT_EXTENSION}")
        return {}
    extra = {"cxx": list(CXX_FLAGS)}
    extension_cls = cpp_extension.CppExtension
    with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    with_cuda = with_cuda and os.environ.get("PROCAP_SKIP_CUDA_BUILD", "0") != "1"
    cuda_sources = sorted(glob.glob("csrc/cuda/*.cu"))
    if with_cuda and cuda_sources:
        sources += cuda_sources
        extra["nvcc"] = ["-O3"]  # no --use_fast_math: distances must round like the fp32 reference
        extra["cxx"] = CXX_FLAGS + ["-DPROCAP_WITH_CUDA"]
        extension_cls = cpp_extension.CUDAExtension
        archs = default_cuda_arch_list(os.environ, torch.cuda.device_count())
        if archs:
            os.environ["TORCH_CUDA_ARCH_LIST"] = archs
            print(f"procap: no GPU visible and TORCH_CUDA_ARCH_LIST unset: building CUDA code for {archs}")
    else:
        with_cuda = False
    print(f"procap: building procap.kernels._C from {len(sources)} sources (CUDA: {with_cuda})")
    ext = extension_cls(
        "procap.kernels._C", sources, extra_compile_args=extra, extra_link_args=["-fopenmp"], optional=True
    )
    build_ext = _optional_build_ext(cpp_extension.BuildExtension).with_options(use_ninja=True)
    return {"ext_modules": [ext], "cmdclass": {"build_ext": build_ext}}


def _extension_setup() -> dict:
    """``ext_modules`` and ``cmdclass`` for the extension, or nothing when skipped or it cannot be set up here."""
    if os.environ.get("PROCAP_SKIP_EXT", "0") == "1":
        print("procap: PROCAP_SKIP_EXT=1, not building the C++/CUDA extension")
        return {}
    try:
        return _torch_extension_setup()
    except ImportError as exc:
        print(
            f"procap: WARNING: torch is not importable at build time ({failure_reason(exc)}), so the C++ extension "
            f"is not built (install torch first, then pip install --no-build-isolation). {WITHOUT_EXTENSION}"
        )
    except Exception as exc:  # noqa: BLE001 - e.g. a broken torch install (OSError loading its libraries)
        print(f"procap: WARNING: the C++ extension cannot be set up ({failure_reason(exc)}). {WITHOUT_EXTENSION}")
    return {}


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
