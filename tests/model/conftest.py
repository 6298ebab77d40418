"""Fixtures for the model tests: a ProCap far smaller than the ``tiny`` preset (16 px, 4x4 grid)."""

from __future__ import annotations

import pytest

from tests.support import small_config


@pytest.fixture
def config():
    return small_config()


@pytest.fixture
def model(config):
    from procap.model.procap import ProCap

    return ProCap(config)
