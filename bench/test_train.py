"""One optimizer step of stage 1 and of stage 2, the fused kernels against the eager references: items/s, peak memory.

Run: ``pytest bench/test_train.py --benchmark-only``. On CUDA the ``clevr`` preset (random weights, k = 2) at batch 8
and 32 under the recipes' bf16 autocast; on a CPU the ``tiny`` preset at batch 2, so the suite runs anywhere (and
``tests/test_bench_train.py`` runs its step at a smaller model in CI). A step is what ``procap.train.loop.Trainer``
does for one batch: zero the gradients, the stage's loss (stage 1: ``ProCap.stage1_loss``, the masking forward and
backward, the frozen VQGAN's group norms, the MSM / align / consistency heads; stage 2: ``ProCap.stage2_loss``), its
backward, gradient clipping, the recipe's AdamW (``stage1_optimizer`` / ``stage2_optimizer``) and its schedule.

``kernels``: ``fused`` is the automatic dispatch (Triton on CUDA, the C++ ops on CPU where built), ``eager`` runs every
fused op's PyTorch reference (``PROCAP_KERNELS=reference``). Every step ends with a device synchronisation, so a round
is one whole step. ``extra_info`` holds ``stage``, ``kernels``, ``batch``, ``items_per_s``, ``ms_per_step`` and
``peak_memory_gb`` (CUDA only); ``bench/gpu_check_report.py`` lists them under the results' ``"train"`` key.
``PROCAP_BENCH_BATCHES`` (e.g. ``8``) narrows the batch sweep.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from procap import kernels
from procap.core.config import ProCapConfig, get_preset
from procap.model.decoder import BOS_ID, EOS_ID, NUM_SPECIALS, PAD_ID
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from procap.train.schedules import stage1_optimizer, stage2_optimizer

STAGES = ("stage1", "stage2")
KERNELS = ("fused", "eager")
_BATCHES = {"cuda": (8, 32), "cpu": (2,)}
_ROUNDS = {"cuda": 10, "cpu": 2}
_RECIPE = {"stage1": ("pretrain", stage1_optimizer), "stage2": ("train", stage2_optimizer)}


def use_kernels(which: str) -> None:
    """``fused``: the automatic dispatch; ``eager``: every fused op's reference. The choice is made afresh."""
    if which not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, got {which!r}")
    if which == "eager":
        os.environ["PROCAP_KERNELS"] = "reference"
    else:
        os.environ.pop("PROCAP_KERNELS", None)
    kernels.reset_dispatch()


def _captions(batch: int, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """(B, L) captions: BOS, words, EOS, PAD, rows of different lengths."""
    words = torch.randint(NUM_SPECIALS, vocab, (batch, length), generator=generator)
    words[:, 0] = BOS_ID
    for row in range(batch):
        end = 2 + row % (length - 2)
        words[row, end] = EOS_ID
        words[row, end + 1 :] = PAD_ID
    return words


def make_step(
    stage: str, batch: int, device: torch.device, config: ProCapConfig | None = None
) -> Callable[[], dict[str, torch.Tensor]]:
    """A callable running one optimizer step of ``stage`` on a fixed random batch (the model is built here).

    Args:
        stage: ``"stage1"`` or ``"stage2"``.
        batch: items per step (procedures in stage 1, pairs in stage 2).
        device: where to train.
        config: the model (default: ``clevr`` with k = 2 on CUDA, ``tiny`` on a CPU).
    """
    recipe, make_optimizer = _RECIPE[stage]
    if config is None:
        config = get_preset("clevr" if device.type == "cuda" else "tiny", num_keyframes=2)
    torch.manual_seed(0)
    model = ProCap(config).to(device).train()
    model.vqgan.requires_grad_(False)  # as both recipes do
    cfg = TrainConfig(stage=recipe).resolved()
    optimizer, schedule = make_optimizer(model, cfg, 1000)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    generator = torch.Generator().manual_seed(0)
    size = config.image_size
    captions = _captions(batch, config.max_caption_len, config.vocab_size, generator).to(device)
    if stage == "stage1":
        frames = torch.rand(batch, config.num_frames, 3, size, size, generator=generator).to(device)
        loss_fn = lambda: model.stage1_loss(frames, captions)
    else:
        before, after = (torch.rand(batch, 3, size, size, generator=generator).to(device) for _ in range(2))
        loss_fn = lambda: model.stage2_loss(before, after, captions)
    amp = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cfg.amp and device.type == "cuda")

    def step() -> dict[str, torch.Tensor]:
        optimizer.zero_grad(set_to_none=True)
        with amp:
            out = loss_fn()
        out["loss"].backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        schedule.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    return step


def train_row(
    stage: str, which: str, batch: int, device: torch.device, rounds: int, config: ProCapConfig | None = None,
    timer: Callable[[Callable[[], Any], int], list[float]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One row of the ``"train"`` results: the step's median seconds over ``rounds`` steps after a warm-up step.

    ``timer(step, rounds)`` returns the seconds of each step (default: ``time.perf_counter`` around each call; the
    benchmark passes pytest-benchmark's rounds).
    """
    use_kernels(which)
    step = make_step(stage, batch, device, config)
    out = step()  # warm-up: autotuning, Triton compilation, the optimizer's state
    if not torch.isfinite(out["loss"].detach()).item():
        raise RuntimeError(f"{stage} ({which}) gave a non-finite loss")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = sorted((timer or _perf_counter_timer)(step, rounds))[rounds // 2]
    return {
        "stage": stage,
        "kernels": which,
        "batch": batch,
        "ms_per_step": seconds * 1e3,
        "items_per_s": batch / seconds,
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None,
    }


def _perf_counter_timer(step: Callable[[], Any], rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


@pytest.fixture
def _restore_kernels():
    saved = os.environ.get("PROCAP_KERNELS")
    yield
    if saved is None:
        os.environ.pop("PROCAP_KERNELS", None)
    else:
        os.environ["PROCAP_KERNELS"] = saved
    kernels.reset_dispatch()


@pytest.mark.usefixtures("_restore_kernels")
@pytest.mark.parametrize("which", KERNELS)
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("batch", sorted(set(_BATCHES["cuda"] + _BATCHES["cpu"])))
def test_train_step(benchmark, bench_device, batch, stage, which):
    from conftest import device_info, swept_batches  # bench/conftest.py (pytest puts bench/ on sys.path)

    batches = swept_batches(_BATCHES, bench_device.type)
    if batch not in batches:
        pytest.skip(f"batch {batch} is not in the {bench_device.type} sweep {batches}")
    rounds = _ROUNDS[bench_device.type]

    def timer(step: Callable[[], Any], n: int) -> list[float]:
        benchmark.pedantic(step, rounds=n, iterations=1, warmup_rounds=0)
        return list(benchmark.stats.stats.data)

    row = train_row(stage, which, batch, bench_device, rounds, timer=timer)
    benchmark.extra_info.update(device_info(bench_device))
    benchmark.extra_info.update(row)
