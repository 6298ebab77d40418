"""Shared test fixtures: a fixed seed for every test and the CUDA skip marker."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


def _cuda_available() -> bool:
    # Checked lazily inside the marker so collection never initialises CUDA.
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA GPU")

os.environ.setdefault("PROCAP_TEST", "1")
