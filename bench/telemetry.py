"""Benchmark-only measurement helpers (bench/test_e2e.py): model FLOPs, peak-throughput table, MFU, GPU telemetry.

GPU telemetry (power, clocks, memory, temperature, utilisation) comes from NVIDIA's NVML through the optional
``nvidia-ml-py`` package (``import pynvml``); without it, or off CUDA, telemetry is reported as ``None``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode
from typing_extensions import Self

from procap.core.validate import device_index

# Dense bf16 tensor-core peaks in FLOP/s (vendor datasheets): the denominators of MFU.
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A40": 150e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
# Dense FP8 (e4m3) tensor-core peaks in FLOP/s (vendor datasheets, without sparsity): MFU's denominator where FP8
# GEMMs run (``Captioner(precision="fp8")``). Twice the bf16 peak on Hopper and Ada; the A100 and A10 have no FP8.
PEAK_FP8_FLOPS = {"H100": 1979e12, "H200": 1979e12, "L40S": 733e12}
# The paper's end-to-end TPS on one A40 (fp32, batch 32, 24 tokens counted per caption); docs/gpu.md lists them.
PAPER_A40_TPS = {1: 766.02, 2: 699.04, 4: 461.24, 7: 270.55}


def peak_flops(device: torch.device | str, precision: str = "bf16") -> float | None:
    """The dense peak of ``device`` in ``precision`` (``"bf16"``: :data:`PEAK_BF16_FLOPS`, ``"fp8"``:
    :data:`PEAK_FP8_FLOPS`), or None (CPU, unknown GPU, a GPU without FP8)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    table = {"bf16": PEAK_BF16_FLOPS, "fp8": PEAK_FP8_FLOPS}[precision]
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in table.items() if key in name), None)


def mfu(
    flops_per_item: float | None, items_per_second: float, device: torch.device | str, precision: str = "bf16"
) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the device's dense peak in ``precision`` (None when unknown).

    With FP8 in use report both: against the bf16 peak (comparable with the bf16 runs) and against the FP8 peak
    (how far the FP8 hardware is used; a lower bound, since only the encoder's GEMMs run in FP8).
    """
    peak = peak_flops(device, precision)
    if peak is None or not flops_per_item:
        return None
    return flops_per_item * items_per_second / peak


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of the matmuls / convolutions / attention ops ``fn`` runs (``torch.utils.flop_counter``)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def pci_bus_id(props: Any) -> str | None:
    """NVML's ``"DDDDDDDD:BB:DD.0"`` bus id of a GPU from ``torch.cuda.get_device_properties`` (None if unknown).

    torch reports the domain, bus and device as ints; NVML's lookup takes the string (an int handed to it through
    ctypes is read as a pointer).
    """
    try:
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except (AttributeError, TypeError, ValueError):
        return None


def nvml_handle(pynvml: Any, index: int, props: Any) -> Any:
    """The NVML handle of torch's device ``index``: by PCI bus id (NVML numbers GPUs physically), else by index."""
    bus = pci_bus_id(props)
    if bus is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def _nvml_handle(device: torch.device):
    try:
        import pynvml
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
        index = device_index(device)  # a device named without an index is the current one
        return pynvml, nvml_handle(pynvml, index, torch.cuda.get_device_properties(index))
    except pynvml.NVMLError:
        return None, None


def _sample(pynvml, handle) -> dict[str, float]:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return {
        "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        "mem_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
        "memory_used_mb": memory.used / 2**20,
        "temperature_c": float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
        "gpu_util_pct": float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
    }


class GPUTelemetry:
    """Sample NVML counters on a background thread while a ``with`` block runs.

    ``summary()`` returns the mean, min and max of each counter plus the GPU's max SM clock, or None when NVML is
    not available (no ``nvidia-ml-py``, no CUDA). The thread stops when the block exits.

    Args:
        device: the CUDA device to watch.
        interval: seconds between samples.
    """

    def __init__(self, device: torch.device | str, interval: float = 0.05) -> None:
        self.device = torch.device(device)
        self.interval = interval
        self.samples: list[dict[str, float]] = []
        self._pynvml, self._handle = _nvml_handle(self.device) if self.device.type == "cuda" else (None, None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(_sample(self._pynvml, self._handle))
            except self._pynvml.NVMLError:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._loop, name="procap-nvml", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def summary(self) -> dict[str, float] | None:
        if self._handle is None or not self.samples:
            return None
        out: dict[str, float] = {"samples": float(len(self.samples))}
        for key in self.samples[0]:
            values = [s[key] for s in self.samples]
            out[f"{key}_mean"] = sum(values) / len(values)
            out[f"{key}_min"] = min(values)  # a clock that dropped during the run shows here
            out[f"{key}_max"] = max(values)
        try:
            out["sm_clock_max_mhz"] = float(
                self._pynvml.nvmlDeviceGetMaxClockInfo(self._handle, self._pynvml.NVML_CLOCK_SM)
            )
        except self._pynvml.NVMLError:
            pass
        return out


def timed(fn: Callable[[], Any], device: torch.device | str) -> tuple[Any, float]:
    """Run ``fn`` once, synchronising the device, and return (result, seconds)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start
