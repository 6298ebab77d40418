"""Build script: the Python package plus the optional C++/CUDA extension (csrc/) as ``procap.kernels._C``.

The C++ (CPU) ops build on any machine with a C++ compiler and torch importable at build time
(``pip install -e . --no-build-isolation``). The CUDA sources (csrc/cuda/*.cu) are added only when torch is a
CUDA build and nvcc is found. ``PROCAP_SKIP_EXT=1`` skips the extension entirely; a failed compile only warns
(the extension is optional) and ``procap.kernels`` then falls back to Triton or the PyTorch references.
"""

import glob
import os

from setuptools import find_packages, setup

packages = [p for p in find_packages(include=["procap", "procap.*"]) if not p.startswith("procap.kernels")]
packages += ["procap.kernels"] + [f"procap.kernels.{p}" for p in find_packages("kernels")]


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
    cxx_flags = ["-O3", "-fopenmp", "-ffp-contract=off"]  # no FMA contraction: round like the reference
    extra = {"cxx": cxx_flags}
    extension_cls = cpp_extension.CppExtension
    with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if with_cuda and os.environ.get("PROCAP_SKIP_CUDA_BUILD", "0") != "1":
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        extra["nvcc"] = ["-O3"]  # no --use_fast_math: distances must round like the fp32 reference
        extra["cxx"] = cxx_flags + ["-DPROCAP_WITH_CUDA"]
        extension_cls = cpp_extension.CUDAExtension
    print(f"procap: building procap.kernels._C from {len(sources)} sources (CUDA: {with_cuda})")
    ext = extension_cls(
        "procap.kernels._C", sources, extra_compile_args=extra, extra_link_args=["-fopenmp"], optional=True
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}}


setup(
    packages=packages,
    package_dir={"procap.kernels": "kernels"},
    **_extension_setup(),
)
