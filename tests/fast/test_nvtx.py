"""NVTX ranges of procap.fast show up in profiler traces (no-ops for NVTX itself off CUDA)."""

from __future__ import annotations

import torch

from procap.fast.nvtx import annotate_module, nvtx_range


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
