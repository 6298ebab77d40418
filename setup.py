"""Build script: the pure-Python package, with the C++/CUDA sources of its compiled ops as package data.

Nothing is compiled here. ``procap.kernels`` compiles ``kernels/csrc/`` on first use, against the torch it finds
then, and caches the library per torch version, Python version and device (``kernels/_ext.py``): so every build of
the wheel is the same ``py3-none-any`` wheel, whoever makes it and whether or not torch is installed at build time.
The package list lives here because ``procap.kernels`` is the ``kernels/`` folder (``procap/kernels`` is a link to it).
"""

from __future__ import annotations

from setuptools import find_packages, setup

if __name__ == "__main__":  # also under pip: setuptools' build backend runs this file as __main__
    packages = [p for p in find_packages(include=["procap", "procap.*"]) if not p.startswith("procap.kernels")]
    packages += ["procap.kernels"] + [f"procap.kernels.{p}" for p in find_packages("kernels")]
    setup(
        packages=packages,
        package_dir={"procap.kernels": "kernels"},
        package_data={
            "procap": ["py.typed"],  # PEP 561: the package ships its type hints
            "procap.assets": ["*.safetensors"],  # the demo's embedded tokenizer
            "procap.kernels": ["csrc/*.cpp", "csrc/*.h", "csrc/cuda/*.cu", "csrc/cuda/*.cuh"],  # compiled on first use
        },
    )
