"""The version of procap, written only here: ``procap.__version__``, ``procap --version`` and the distribution's
metadata (pyproject.toml's ``[tool.setuptools.dynamic]``) all read it. No imports, so reading it is instant."""

__version__ = "0.1.0"
