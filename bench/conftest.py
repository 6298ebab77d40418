"""Shared benchmark helpers: device/version info for ``benchmark.extra_info`` and a synchronising timer."""

from __future__ import annotations

import datetime
import platform

import pytest
import torch


def device_info(device: torch.device | str) -> dict[str, object]:
    """Device, versions and date recorded with every benchmark result."""
    device = torch.device(device)
    info: dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "threads": torch.get_num_threads(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@pytest.fixture(scope="session")
def bench_device() -> torch.device:
    """CUDA when present, else CPU (the suite then runs its CPU-sized shapes)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
