"""The benchmark-only helpers in bench/telemetry.py: FLOP counting, MFU / peak table, NVML telemetry off CUDA."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_SPEC = importlib.util.spec_from_file_location("bench_telemetry", Path(__file__).parents[1] / "bench" / "telemetry.py")
telemetry = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(telemetry)


def test_count_flops_of_a_matmul():
    layer = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(4, 16)
    assert telemetry.count_flops(lambda: layer(x)) == 2 * 4 * 16 * 8


def test_cpu_has_no_peak_and_no_telemetry():
    assert telemetry.peak_flops("cpu") is None and telemetry.mfu(1e9, 10.0, "cpu") is None
    with telemetry.GPUTelemetry("cpu") as gpu:
        pass
    assert gpu.summary() is None
    assert set(telemetry.PAPER_A40_TPS) == {1, 2, 4, 7}
