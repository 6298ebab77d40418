"""Benchmark helpers: FLOP counting, MFU / peak table, NVML telemetry off CUDA, NVTX ranges in profiler traces."""

from __future__ import annotations

import torch

from procap.fast.nvtx import annotate_module, nvtx_range
from procap.fast.telemetry import PAPER_A40_TPS, GPUTelemetry, count_flops, mfu, peak_flops


def test_count_flops_of_a_matmul():
    layer = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(4, 16)
    assert count_flops(lambda: layer(x)) == 2 * 4 * 16 * 8


def test_cpu_has_no_peak_and_no_telemetry():
    assert peak_flops("cpu") is None and mfu(1e9, 10.0, "cpu") is None
    with GPUTelemetry("cpu") as telemetry:
        pass
    assert telemetry.summary() is None
    assert set(PAPER_A40_TPS) == {1, 2, 4, 7}


def test_nvtx_ranges_show_in_profiler_on_cpu():
    layer = torch.nn.Linear(4, 4)
    handles = annotate_module(layer, "procap.test_module", "cpu")
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, nvtx_range("procap.test_block", "cpu"):
        layer(torch.randn(2, 4))
    for handle in handles:
        handle.remove()
    names = {event.name for event in prof.events()}
    assert {"procap.test_block", "procap.test_module"} <= names
