"""Fixtures for the model tests: a ProCap far smaller than the ``tiny`` preset (16 px, 4x4 grid)."""

from __future__ import annotations

import pytest
import torch

from .model_helpers import small_config


@pytest.fixture(autouse=True)
def _one_thread():
    # These shapes are tiny: intra-op threads only add synchronisation, and on a shared 2-core machine OpenMP
    # spin-waiting made the suite ~5x slower. Restored afterwards for the other test folders.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def config():
    return small_config()


@pytest.fixture
def model(config):
    from procap.model.procap import ProCap

    return ProCap(config)
