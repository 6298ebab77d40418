"""Shared benchmark helpers: device/version info for ``benchmark.extra_info``, kernel timing, bandwidth.

Kernel timing (:func:`time_op`). A 10-40 us kernel timed with a host synchronisation per call measures launch and
sync overhead, not the kernel. On CUDA every op is therefore timed twice: ``triton.testing.do_bench`` (CUDA events
around each call, the L2 cache flushed before each so calls start cold, the GPU kept busy so launch latency is
hidden; median), which gives the reported rates, and pytest-benchmark rounds of :data:`LAUNCHES_PER_ROUND`
back-to-back calls with one synchronisation at the end (per call: the round time / launches, what a stream of calls
costs including Python launch overhead). On the CPU ops run synchronously and a round is one call.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Callable, Iterator
from typing import Any

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


# HBM bandwidth in bytes/s (vendor datasheets): the denominator of ``bandwidth_fraction``. More specific names first.
PEAK_BANDWIDTH = {
    "H100 PCIe": 2.0e12,
    "H100 NVL": 3.9e12,
    "H100": 3.35e12,
    "H200": 4.8e12,
    "A100-PCIE-40GB": 1.555e12,
    "A100": 2.039e12,
    "A40": 0.696e12,
    "L40S": 0.864e12,
    "A10": 0.6e12,
}
LAUNCHES_PER_ROUND = {"cuda": 50, "cpu": 1}


def peak_bandwidth(device: torch.device | str) -> float | None:
    """The HBM bandwidth of ``device`` from :data:`PEAK_BANDWIDTH`, or None (CPU, unknown GPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)


def time_op(benchmark: Any, fn: Callable[[], Any], device: torch.device, rounds: int) -> float:
    """Time ``fn`` (see the module docstring) and return the seconds per call that rates should use.

    Records ``seconds_per_call`` (do_bench's median on CUDA, the median round on CPU), ``pipelined_seconds_per_call``
    and ``launches_per_round`` in ``benchmark.extra_info``.
    """
    launches = LAUNCHES_PER_ROUND[device.type]

    def round_of_calls() -> None:
        for _ in range(launches):
            fn()
        synchronize(device)

    round_of_calls()  # warm-up: compilation, autotuning and allocator growth stay out of the timing
    benchmark.pedantic(round_of_calls, rounds=rounds, iterations=1, warmup_rounds=1)
    pipelined = benchmark.stats.stats.median / launches
    seconds = pipelined
    if device.type == "cuda":
        from triton.testing import do_bench

        seconds = do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3  # ms -> s
    benchmark.extra_info.update(
        {"seconds_per_call": seconds, "pipelined_seconds_per_call": pipelined, "launches_per_round": launches}
    )
    return seconds


def bandwidth_info(bytes_moved: int, seconds: float, device: torch.device) -> dict[str, float | None]:
    """GB/s over the bytes an op must move, and the fraction of the device's HBM bandwidth (None off CUDA)."""
    peak = peak_bandwidth(device)
    rate = bytes_moved / seconds
    return {
        "gbps": rate / 1e9,
        "peak_gbps": peak / 1e9 if peak else None,
        "bandwidth_fraction": rate / peak if peak else None,
    }


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def swept_batches(defaults: dict[str, tuple[int, ...]], device_type: str) -> tuple[int, ...]:
    """The batch sizes a suite sweeps on ``device_type``: ``PROCAP_BENCH_BATCHES`` (``1,32``) when set, else the
    suite's ``defaults`` for the device type."""
    chosen = os.environ.get("PROCAP_BENCH_BATCHES")
    return tuple(int(b) for b in chosen.split(",")) if chosen else defaults[device_type]


@pytest.fixture(scope="session")
def bench_device() -> torch.device:
    """CUDA when present, else CPU (the suite then runs its CPU-sized shapes)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture()
def one_cpu_thread(bench_device: torch.device) -> Iterator[None]:
    """One intra-op thread on CPU for the test, the previous count restored after it: tiny shapes on a shared machine
    time more stably without thread spinning. A module asks for it with ``pytest.mark.usefixtures``."""
    threads = torch.get_num_threads()
    if bench_device.type == "cpu":
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
