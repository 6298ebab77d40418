"""Where the time of one captioning batch goes: each stage of ``procap.fast.Captioner`` timed alone, k = 2.

Run: ``pytest bench/test_stages.py --benchmark-only``. The ``clevr`` preset with random weights on CUDA (bf16,
channels-last VQGAN, the Captioner's attention backend, decoding steps replayed from their CUDA graph), ``tiny`` in
fp32 on a CPU. Stages, each with its inputs precomputed by the previous ones:

- ``vqgan``: the VQGAN encoder on the 2B before/after images;
- ``encoder``: the procedure encoder's Transformer on the (B, (k + 2) * n, D) sequence;
- ``memory_mlp``: encoder outputs -> decoder memory;
- ``prefill``: every decoder layer's cross-attention keys/values of the memory;
- ``decode``: one caption's ``max_len - 1`` cached decoding steps (reported per step as well);
- ``total``: ``Captioner.generate`` end to end, to compare with the sum (the rest: input casts, the embeddings and
  positions of the sequence).

Timing is ``conftest.time_op`` (``triton.testing.do_bench`` on CUDA). ``extra_info`` holds ms per batch and per
pair, the stage's FLOPs (``torch.utils.flop_counter``) and TFLOP/s. ``PROCAP_BENCH_BATCHES`` (e.g. ``1,32``)
narrows the batch sweep.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import device_info, swept_batches, time_op
from telemetry import count_flops

from procap.core.config import get_preset
from procap.fast import Captioner
from procap.fast.bucket import Bucket
from procap.model.procap import ProCap

K, STEPS = 2, 24
STAGES = ("vqgan", "encoder", "memory_mlp", "prefill", "decode", "total")
_BATCHES = {"cuda": (1, 8, 32, 128), "cpu": (1, 4)}
_setups: dict[tuple[str, int], dict[str, Callable[[], object]]] = {}


# tiny CPU shapes time more stably on one intra-op thread (the fixture is in conftest.py)
pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def _stage_fns(device: torch.device, batch: int) -> dict[str, Callable[[], object]]:
    """One callable per stage on the Captioner's prepared model; intermediate inputs computed once here."""
    key = (device.type, batch)
    if key in _setups:
        return _setups[key]
    config = get_preset("clevr" if device.type == "cuda" else "tiny", num_keyframes=K, max_caption_len=STEPS + 1)
    torch.manual_seed(0)
    with torch.device(device):
        model = ProCap(config).eval()
    captioner = Captioner(model, None, device=device, max_len=STEPS + 1, batch_sizes=(batch,), copy_model=False)
    m, dtype = captioner.model, captioner.dtype
    s = config.image_size
    before, after = (torch.rand(batch, 3, s, s, device=device, dtype=dtype) for _ in range(2))
    images = torch.stack([before, after], dim=1).flatten(0, 1)  # (2B, 3, S, S), the order procedure_tokens uses
    if device.type == "cuda":
        images = images.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        tokens = m.procedure_tokens(before, after)
        encoded = m.encoder(tokens)
        memory = m.memory_mlp(encoded)
    pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
    bucket = Bucket(m, batch, STEPS + 1, dtype, device, pool)  # what the Captioner decodes with
    bucket.prefill(memory)
    step = bucket.step_replay() if captioner.use_graphs else bucket.step

    def decode() -> None:
        bucket.decoding.reset()  # four tiny fills, so that every call decodes a whole caption
        for _ in range(STEPS):
            step()

    _setups[key] = {
        "vqgan": lambda: m.vqgan.features(images),
        "encoder": lambda: m.encoder(tokens),
        "memory_mlp": lambda: m.memory_mlp(encoded),
        "prefill": lambda: bucket.prefill(memory),
        "decode": decode,
        "total": lambda: captioner.generate(before, after),
    }
    return _setups[key]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("batch", sorted(set(_BATCHES["cuda"] + _BATCHES["cpu"])))
def test_stage(benchmark, bench_device, batch, stage):
    batches = swept_batches(_BATCHES, bench_device.type)
    if batch not in batches:
        pytest.skip(f"batch {batch} is not in the {bench_device.type} sweep {batches}")
    fn = _stage_fns(bench_device, batch)[stage]
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, benchmark=True):
        seconds = time_op(benchmark, fn, bench_device, rounds=10 if bench_device.type == "cuda" else 3)
        flops = count_flops(fn) if stage != "decode" or bench_device.type != "cuda" else None
    info = benchmark.extra_info
    info.update(device_info(bench_device))
    info.update({"stage": stage, "batch": batch, "k": K, "steps": STEPS, "ms_per_batch": seconds * 1e3})
    info["ms_per_pair"] = seconds * 1e3 / batch
    if stage == "decode":
        info["ms_per_step"] = seconds * 1e3 / STEPS
    info["gflops"] = flops / 1e9 if flops is not None else None
    info["tflops_per_s"] = flops / seconds / 1e12 if flops else None
