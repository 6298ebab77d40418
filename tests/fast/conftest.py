"""Fixtures of the command-line tests of the fast path."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, trained, vocab):
    """The trained tiny model (tests/conftest.py) saved as a checkpoint file."""
    from procap.loading.checkpoint import save_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    save_checkpoint(path, trained[0], vocab)
    return path
