"""bench/test_train.py's step on a CPU at a small model, so CI runs what the GPU benchmark times: both stages, the
fused dispatch and the eager references, and the row the results' ``"train"`` key holds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from procap.kernels.dispatch import forced_impl
from tests.support import small_config

ROOT = Path(__file__).resolve().parents[1]


def _train_bench():
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "test_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _train_bench()


@pytest.mark.usefixtures("fresh_dispatch")
@pytest.mark.parametrize("which", ["fused", "eager"])
@pytest.mark.parametrize("stage", ["stage1", "stage2"])
def test_one_step_row(stage, which, monkeypatch):
    # The eager rows set PROCAP_KERNELS in os.environ: recorded here so that it is unset again after the test (left
    # set, every later subprocess of the suite ran the references).
    monkeypatch.setenv("PROCAP_KERNELS", "")
    row = bench.train_row(stage, which, 2, torch.device("cpu"), rounds=1, config=small_config(num_keyframes=1))
    assert forced_impl() == ("reference" if which == "eager" else "")
    assert row["stage"] == stage and row["kernels"] == which and row["batch"] == 2
    assert row["items_per_s"] > 0 and row["ms_per_step"] > 0 and row["peak_memory_gb"] is None


def test_unknown_kernels_are_refused():
    with pytest.raises(ValueError, match="kernels must be one of"):
        bench.use_kernels("triton")
