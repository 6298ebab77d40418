"""Shared test fixtures: a fixed seed for every test and the CUDA skip marker."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

# triton reads TRITON_INTERPRET when it is imported and when kernels are decorated; any test folder may import it
# first, so the switch is set here, before every test module. Without CUDA the kernels run in the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _one_thread():
    # Test shapes are tiny: intra-op threads only add synchronisation, and on a loaded 2-core machine OpenMP
    # spin-waiting made suites 5-10x slower. Restored afterwards.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
