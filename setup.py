"""Build script: the Python package plus the optional C++/CUDA extension (csrc/)."""

from setuptools import find_packages, setup

packages = [p for p in find_packages(include=["procap", "procap.*"]) if not p.startswith("procap.kernels")]
packages += ["procap.kernels"] + [f"procap.kernels.{p}" for p in find_packages("kernels")]

setup(
    packages=packages,
    package_dir={"procap.kernels": "kernels"},
)
