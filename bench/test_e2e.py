"""End-to-end captioning throughput (TPS) against the paper's A40 figures (docs/gpu.md).

Paper configuration: ``clevr`` preset with random weights, k in {1, 2, 4, 7}, 24 decoding steps per caption
with no early exit (the decoder's position table is one row longer than the preset's 24 so that 24 steps
follow BOS). Two providers run in the same session:

- ``eager_fp32``: ``ProCap.generate`` in fp32 at batch 32, the full prefix recomputed every step (no KV cache),
  mirroring the authors' protocol;
- ``fast``: ``procap.fast.Captioner`` (bf16, static KV cache, CUDA graphs) at batch 1 / 8 / 32 / 128, with the
  decoding step captured (``decode_graph``) or the whole forward (``whole_graph``, batch 1 and 8);
- ``fast_compiled`` (CUDA, k = 2): the same with ``torch_compile=True`` (VQGAN encoder and procedure encoder through
  ``torch.compile``), the first call's compile time reported apart as ``compile_s``.

VQGAN, encoder and decoder are all inside the timing; image decoding from disk is not. Reported in
``extra_info``: TPS under the paper's counting (24 tokens per caption) and up to EOS, latency per batch,
captions/s, peak memory, model FLOPs per pair (``torch.utils.flop_counter``, KV-cached decoding, attention via
the math backend so every matmul is counted), MFU against the bf16 peak, the ratio to the paper's A40 TPS and
NVML telemetry. On a CPU the suite runs the ``tiny`` preset at small batches so CI exercises it.
``PROCAP_BENCH_K=2`` narrows the k sweep.

Run: ``pytest bench/test_e2e.py --benchmark-only --benchmark-json bench/results/<name>.json``.
"""

from __future__ import annotations

import os
import resource
import time

import pytest
import torch
from conftest import device_info, synchronize
from telemetry import PAPER_A40_TPS, GPUTelemetry, count_flops, mfu, peak_flops

from procap.core.config import get_preset
from procap.fast import Captioner
from procap.kernels.attention import select_backend, use_backend
from procap.model.decoder import PAD_ID
from procap.model.procap import ProCap

# PROCAP_BENCH_K (e.g. "2") narrows the k sweep, as bench/gpu_check.sh does.
KEYFRAMES = tuple(int(k) for k in os.environ.get("PROCAP_BENCH_K", "1,2,4,7").split(","))
STEPS = 24  # decoding steps (tokens) per caption, the paper's counting
GPU_BATCHES, CPU_BATCHES = (1, 8, 32, 128), (1, 4)
COMPILE_BATCHES = (8, 32)  # every batch shape compiles anew (about a minute each)
REFERENCE_BATCH = {"cuda": 32, "cpu": 4}
_models: dict[int, ProCap] = {}
_reference_tps: dict[int, float] = {}
_flops: dict[int, dict[str, int]] = {}
_allocated_before: dict[str, float] = {}


# tiny CPU shapes time more stably on one intra-op thread (the fixture is in conftest.py)
pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def _model(k: int, device: torch.device) -> ProCap:
    """Random-weight model for k keyframes: ``clevr`` on CUDA, ``tiny`` on CPU; cached for the session."""
    if k not in _models:
        preset = "clevr" if device.type == "cuda" else "tiny"
        config = get_preset(preset, num_keyframes=k, max_caption_len=STEPS + 1)
        torch.manual_seed(0)
        with torch.device(device):
            _models[k] = ProCap(config).eval()
    return _models[k]


def _images(model: ProCap, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(batch)
    s = model.config.image_size
    return tuple(torch.rand(batch, 3, s, s, device=device, generator=gen) for _ in range(2))


def _model_flops(k: int, device: torch.device) -> dict[str, int]:
    """FLOPs per pair: the useful work (KV-cached decoding) and the eager reference's (prefix recomputed)."""
    if k not in _flops:
        model = _model(k, device)
        before, after = _images(model, 1, device)
        counter = Captioner(
            model,
            None,
            device=device,
            dtype=torch.float32,
            max_len=STEPS + 1,
            batch_sizes=(1,),
            use_graphs=False,
            attention_backend="math",
            fused_vqgan=False,  # model FLOPs on the reference graph: the 4x4 downsample's zero taps are not model work
        )
        with use_backend("math"):
            cached = count_flops(lambda: counter.generate(before, after))
            eager = count_flops(lambda: model.generate(before, after, max_len=STEPS + 1))
        _flops[k] = {"model_flops_per_pair": cached, "eager_flops_per_pair": eager}
        del counter
    return _flops[k]


def _peak_memory(device: torch.device) -> dict[str, float | None]:
    if device.type == "cuda":
        # The peak includes every model still cached in this session (the fp32 reference weights among them).
        return {
            "peak_memory_mb": torch.cuda.max_memory_allocated(device) / 2**20,
            "allocated_before_run_mb": _allocated_before.get("mb"),
        }
    # Linux reports ru_maxrss in KiB: the process's high-water mark, not per test.
    return {"peak_memory_mb": None, "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _report(
    benchmark,
    device: torch.device,
    k: int,
    batch: int,
    tokens: torch.Tensor,
    provider: str,
    telemetry: GPUTelemetry,
    flops_key: str,
) -> float | None:
    """Fill ``extra_info`` from the median time of one batch; returns the paper-counted TPS.

    Under ``--benchmark-disable`` the call ran once as a smoke test and nothing was timed: returns None.
    """
    if benchmark.stats is None:
        return None
    seconds = benchmark.stats.stats.median
    honest = int((tokens != PAD_ID).sum())  # tokens up to and including EOS
    tps = batch * STEPS / seconds
    flops = _model_flops(k, device)
    preset = _model(k, device).config.name
    # Only the paper-sized model is comparable with the paper's A40 numbers.
    ratio = tps / PAPER_A40_TPS[k] if preset == "clevr" else None
    info = benchmark.extra_info
    info.update(device_info(device))
    info.update(_peak_memory(device))
    info.update(flops)
    info.update(
        {
            "provider": provider,
            "k": k,
            "batch": batch,
            "preset": preset,
            "steps": STEPS,
            "dtype": "float32" if provider == "eager_fp32" else str(_dtype(device)).replace("torch.", ""),
            "attention_backend": select_backend(device, torch.float32 if provider == "eager_fp32" else _dtype(device)),
            "latency_s_per_batch": seconds,
            "captions_per_s": batch / seconds,
            "tps_paper": tps,
            "tps_up_to_eos": honest / seconds,
            "tokens_up_to_eos_per_caption": honest / batch,
            "paper_a40_tps": PAPER_A40_TPS[k],
            "ratio_to_paper_a40": ratio,
            "peak_bf16_flops": peak_flops(device),
            "mfu": mfu(flops[flops_key], batch / seconds, device),
            "gpu_telemetry": telemetry.summary(),
        }
    )
    return tps


def _dtype(device: torch.device) -> torch.dtype:
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _run(benchmark, device: torch.device, fn, rounds: int):
    """Warm up once outside the timing, then time ``rounds`` synchronised calls under NVML sampling."""
    fn()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        _allocated_before["mb"] = torch.cuda.memory_allocated(device) / 2**20

    def call():
        out = fn()
        synchronize(device)
        return out

    with GPUTelemetry(device) as telemetry:
        tokens = benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=0)
    return tokens, telemetry


@pytest.mark.parametrize("k", KEYFRAMES)
def test_e2e_eager_fp32(benchmark, bench_device, k):
    """The authors' protocol: fp32 ``ProCap.generate`` (no KV cache), batch 32, 24 steps counted."""
    batch = REFERENCE_BATCH[bench_device.type]
    model = _model(k, bench_device)
    before, after = _images(model, batch, bench_device)
    if bench_device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # true fp32, like the paper's A40 runs
        torch.backends.cudnn.allow_tf32 = False
    tokens, telemetry = _run(
        benchmark,
        bench_device,
        lambda: model.generate(before, after, max_len=STEPS + 1),
        rounds=3 if bench_device.type == "cuda" else 1,
    )
    tps = _report(benchmark, bench_device, k, batch, tokens, "eager_fp32", telemetry, "eager_flops_per_pair")
    if tps is not None:
        _reference_tps[k] = tps


@pytest.mark.parametrize("capture_memory", [False, True], ids=["decode_graph", "whole_graph"])
@pytest.mark.parametrize("batch", GPU_BATCHES + tuple(b for b in CPU_BATCHES if b not in GPU_BATCHES))
@pytest.mark.parametrize("k", KEYFRAMES)
def test_e2e_fast(benchmark, bench_device, k, batch, capture_memory):
    """``procap.fast.Captioner`` at one batch size; speed-up against the eager run of the same session.

    ``whole_graph`` captures the whole pipeline, VQGAN + encoder + prefill + every decoding step, in one graph
    per bucket (``capture_memory=True``, the Captioner's default on CUDA): CUDA only, at every batch.
    """
    batches = GPU_BATCHES if bench_device.type == "cuda" else CPU_BATCHES
    if batch not in batches:
        pytest.skip(f"batch {batch} is not in the {bench_device.type} sweep {batches}")
    if capture_memory and bench_device.type != "cuda":
        pytest.skip("whole-graph capture is CUDA only")
    model = _model(k, bench_device)
    captioner = Captioner(
        model,
        None,
        device=bench_device,
        dtype=_dtype(bench_device),
        max_len=STEPS + 1,
        batch_sizes=(batch,),
        capture_memory=capture_memory,
    )
    before, after = _images(model, batch, bench_device)
    rounds = (30 if batch <= 8 else 10) if bench_device.type == "cuda" else 3
    tokens, telemetry = _run(benchmark, bench_device, lambda: captioner.generate(before, after), rounds)
    tps = _report(benchmark, bench_device, k, batch, tokens, "fast", telemetry, "model_flops_per_pair")
    if tps is not None and k in _reference_tps:
        benchmark.extra_info["speedup_vs_eager_fp32"] = tps / _reference_tps[k]
    benchmark.extra_info["cuda_graphs"] = captioner.use_graphs
    benchmark.extra_info["capture_memory"] = capture_memory


@pytest.mark.parametrize("capture_memory", [False, True], ids=["decode_graph", "whole_graph"])
@pytest.mark.parametrize("batch", GPU_BATCHES)
def test_e2e_fast_compiled(benchmark, bench_device, batch, capture_memory):
    """``Captioner(torch_compile=True)`` at k = 2 (CUDA only): the compiled VQGAN and encoder against the eager
    fast path and the whole-forward CUDA graph; the first call's compile time is reported apart (``compile_s``)."""
    if bench_device.type != "cuda":
        pytest.skip("torch.compile is measured on CUDA only (Inductor's CPU compile is minutes on a CPU runner)")
    if 2 not in KEYFRAMES:
        pytest.skip("the compiled path is measured at k = 2")
    if batch not in COMPILE_BATCHES or (capture_memory and batch > 8):
        pytest.skip(f"the compiled path is measured at batches {COMPILE_BATCHES} (whole graph: 8), each compiles apart")
    model = _model(2, bench_device)
    captioner = Captioner(
        model,
        None,
        device=bench_device,
        dtype=_dtype(bench_device),
        max_len=STEPS + 1,
        batch_sizes=(batch,),
        capture_memory=capture_memory,
        torch_compile=True,
    )
    before, after = _images(model, batch, bench_device)
    start = time.perf_counter()
    captioner.generate(before, after)  # compiles (and captures) here, outside the timing
    synchronize(bench_device)
    compile_seconds = time.perf_counter() - start
    tokens, telemetry = _run(
        benchmark, bench_device, lambda: captioner.generate(before, after), 30 if batch <= 8 else 10
    )
    tps = _report(benchmark, bench_device, 2, batch, tokens, "fast_compiled", telemetry, "model_flops_per_pair")
    if 2 in _reference_tps:
        benchmark.extra_info["speedup_vs_eager_fp32"] = tps / _reference_tps[2]
    benchmark.extra_info.update(
        {"cuda_graphs": captioner.use_graphs, "capture_memory": capture_memory, "compile_s": compile_seconds}
    )
