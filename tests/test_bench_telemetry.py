"""The benchmark-only helpers in bench/telemetry.py: FLOP counting, MFU / peak table, NVML telemetry off CUDA."""

from __future__ import annotations

import importlib.util
import types
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


def test_mfu_against_the_fp8_peak_halves_it_on_hopper_and_is_none_without_fp8(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    bf16 = telemetry.mfu(1e12, 100.0, "cuda")
    fp8 = telemetry.mfu(1e12, 100.0, "cuda", "fp8")
    assert bf16 == 1e14 / 989e12 and fp8 == 1e14 / 1979e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert telemetry.peak_flops("cuda", "fp8") is None and telemetry.mfu(1e12, 100.0, "cuda", "fp8") is None
    assert telemetry.peak_flops("cuda") == 312e12


class _FakeNVML:
    """Records what the handle lookups receive; real NVML reads a non-string bus id as a pointer (segfault)."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        self.calls.append(("bus", bus))
        if not isinstance(bus, str | bytes):
            raise TypeError(f"NVML needs the bus id as a string, got {type(bus).__name__}")
        return f"handle:{bus}"

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append(("index", index))
        return f"handle:{index}"


def test_nvml_lookup_gets_the_bus_id_string():
    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0, name="H100")
    assert telemetry.pci_bus_id(props) == "00000000:1B:00.0"
    nvml = _FakeNVML()
    assert telemetry.nvml_handle(nvml, 3, props) == "handle:00000000:1B:00.0"
    assert nvml.calls == [("bus", "00000000:1B:00.0")]


def test_nvml_lookup_falls_back_to_the_index():
    nvml = _FakeNVML()
    assert telemetry.nvml_handle(nvml, 2, types.SimpleNamespace(name="no pci fields")) == "handle:2"
    assert nvml.calls == [("index", 2)]
