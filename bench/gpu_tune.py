"""A/B timing of named fast-path variants in one process on one model: CUDA events at batch 1 and 32, the NVML SM
clock beside each, a correctness gate per variant, every kernel of a call per variant and batch, and a compact table
printed last.

    python bench/gpu_tune.py --variants all,readable_encoder,encoder_gelu_epilogue --batches 1,32 --out tune.json
    python bench/gpu_tune.py --list

One random-weight model (``--preset``, k = ``--k``) is built once; every variant is a ``Captioner`` over a copy of it
with the variant's options, and may carry a written estimate of the milliseconds it saves at batch 32 (``--list``
prints it; the results keep it beside the measurement). Per variant and batch: the first call
(capture, cuDNN autotuning, compilation) is timed apart as ``setup_s``, then ``--iters`` calls are timed with CUDA
events, one pair of events around each call (the median is reported, with TPS counting 24 tokens per caption as
the paper does, and MFU from the model FLOPs of the reference graph). Beside each batch's timing, the SM clock NVML
sampled during the timed calls (``nvidia-ml-py``; without it the clocks are left out and the run says so once): a
power-capped GPU runs below its maximum clock, and a slower variant may only have run at a lower one. The gate: the
decoder memory of the largest batch against the fp32 oracle's (``ProCap.memory`` in fp32, TF32 off), as
``||delta|| / ||oracle||``, and the fraction of tokens equal to the first variant's. At each of
``--profile-batches`` (default 1 and 32), one profiled call per variant records every kernel with device time (no
cut: the JSON holds them all; ``--top`` only shortens the printed tables). No new variant starts after
``--deadline`` seconds; the JSON is written in any case, and the compact table is the last thing printed (a remote
run returns the tail of its output).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEPS = 24  # decoded tokens per caption, the paper's counting
# The decoding step is the model decoder's fused one in every variant: it is the only cached step since the
# readable one was folded into it (the 2026-11-26 run measured it against that step: -1.5 ms at b32).
BASELINE = {"fused_vqgan": False, "capture_memory": False}
FUSED_ENCODER_ONLY_BIAS = {"downsample_4x4": False, "input_channels": None}


@dataclass(frozen=True)
class Variant:
    """One configuration of the fast path: Captioner keyword arguments, and kernel switches set around its run.

    ``estimate_ms_b32`` / ``estimate_ms_b1``: the written prediction of the milliseconds it saves at batch 32 (and
    1) against ``all`` (from the profile of docs/gpu.md), recorded before it is measured and kept beside the
    measurement in the results.
    """

    description: str
    captioner: dict[str, Any] = field(default_factory=dict)
    estimate_ms_b32: float | None = None
    estimate_ms_b1: float | None = None


VARIANTS: dict[str, Variant] = {
    "baseline": Variant(
        "the 2026-11-23 path with today's decoding step and GN statistics (the only ones): readable VQGAN encoder, "
        "decode-step graph",
        BASELINE,
    ),
    "whole_graph": Variant("baseline + one graph over the whole pipeline", {**BASELINE, "capture_memory": True}),
    "compile": Variant("baseline + torch.compile of the VQGAN and the encoder", {**BASELINE, "torch_compile": True}),
    "compile_whole_graph": Variant(
        "compile + whole graph", {**BASELINE, "torch_compile": True, "capture_memory": True}
    ),
    "fold_bias": Variant(
        "baseline + bias-free convolutions (biases in the GN, the residual add, the GEMM epilogues)",
        {**BASELINE, "fused_vqgan": FUSED_ENCODER_ONLY_BIAS},
    ),
    "down4x4": Variant("fold_bias + the 4x4 downsample", {**BASELINE, "fused_vqgan": {"input_channels": None}}),
    "conv_in8": Variant("down4x4 + conv_in on 8 input channels", {**BASELINE, "fused_vqgan": True}),
    "all": Variant("every change: the Captioner's defaults", {}),
    "all_compile": Variant("all + torch.compile", {"torch_compile": True}),
    # Measured on an H100 on 2026-11-26 (bench/results/h100-2026-11-26-run2.json, docs/gpu.md): the add + LayerNorm
    # fusion became the default; the GELU epilogue is faster again but approximates the model's erf GELU.
    "readable_encoder": Variant(
        "all with the procedure encoder's readable stack (the default before 2026-11-26's second run: its add + "
        "LayerNorm fusion measured -0.87 ms at b32, so the fusion became the default)",
        {"fused_encoder": False},
    ),
    "encoder_gelu_epilogue": Variant(
        "all + the encoder MLP's bias + GELU in the fc1 GEMM epilogue (cuBLASLt; tanh-approximated, the model's "
        "GELU is erf: gated by memory and token agreement)",
        {"fused_encoder": {"add_norm": True, "gelu_epilogue": True}},
        estimate_ms_b32=1.1,
    ),
    # Issue 51 item 4a, estimated before any GPU ran it (docs/gpu.md, "Prepared for issue 51"): the fp32 logits GEMM
    # ran 24 x 15 us at b32 (sgemm_largek); a GEMV of 80 x 512 from L2 with the pick is about 3-5 us a launch.
    "decode_logits_pick": Variant(
        "all + the decoding step's fp32 logits GEMV and per-tile greedy pick in one Triton kernel (the decoder's "
        "logits_pick), instead of the cuBLAS GEMM",
        {"fused_decoder": {"logits_pick": True}},
        estimate_ms_b32=0.25,
        estimate_ms_b1=0.05,
    ),
    # Issue 51 item 4c, estimated before any GPU ran it (docs/gpu.md, "Prepared for issue 51"). The 2026-11-26 b32
    # profile: the cross attention ran on cuDNN's sm80 wmma kernel, 48 launches (24 steps x 2 layers) = 1.065 ms,
    # 22.2 us each, reading one layer's keys and values, 32 x 784 x 1024 x 2 B = 51.4 MB (2.3 TB/s; the two layers'
    # 103 MB do not stay in the 50 MB L2). Split-K reads the same bytes at the ~2.9 TB/s the GN apply kernel reached:
    # 17.7 us, + 0.6 us of partials (3,328 x 66 fp32 written and read) + ~2 us for the combine launch = ~20 us, so
    # 48 x ~2 us = -0.1 ms at b32 (the floor at 3.35 TB/s, 15.3 us + the combine, bounds it at -0.2). b1 was never
    # profiled: 8 CTAs (one per head) walk 784 keys from L2 in 7 dependent 128-key steps, guessed 8-10 us; split-K
    # is 104 programs of one 64-key tile (~3 us) + the combine (~2 us): ~-4 us x 48 = -0.2 ms, -0.15 after the
    # ~70 % the last six estimates reached.
    "decode_split_k": Variant(
        "all + the decoding step's cross attention through the split-K Triton kernels (the decoder's "
        "split_k_attention) instead of cuDNN's sm80 kernel",
        {"fused_decoder": {"split_k_attention": True}},
        estimate_ms_b32=0.1,
        estimate_ms_b1=0.15,
    ),
    # Issue 51 item 4b, estimated before any GPU ran it (docs/gpu.md, "Prepared for issue 51"). The issue's table:
    # the step's 288 GEMM launches (24 steps x 2 layers x 6), the fp32 logits (24 x 15 us = 0.36 ms) and the
    # decoder attention (48 launches, ~7 us each: ~0.34 ms) make ~2.6 ms at b32, so a GEMM launch is ~6.6 us
    # ((2.6 - 0.36 - 0.34) / 288). The MLP of one layer and step is two of them plus the GELU (~2 us): ~15 us, x 48
    # layer-steps = 0.73 ms now. The kernel: 2 row blocks x 16 hidden slices = 32 programs, each reading 256 KB of
    # L2-resident weights (~1.0-1.7 us at 150-250 GB/s a SM), then the last program of a row block sums 16 partials
    # of 16 x 512 fp32 (512 KB in 16 blocks: ~2.5-4 us), plus ~2 us of launch and ramp: 6-8 us, 0.29-0.38 ms.
    # Saved 0.35-0.44 ms, x 0.7 (the last six estimates reached ~70 %): -0.3 ms. At b1 (never profiled): two GEMVs
    # of ~4.5 us and the GELU, ~11 us x 48 = 0.53 ms, against 16 programs and a 32 KB sum, ~4 us x 48 = 0.19 ms:
    # 0.34 x 0.7 = -0.2 ms (b1 has more launches per ms: the launch bound shows more there). Revised at the merge with
    # decode_split_k's reading of the same profile: the cross attention was 48 x 22 us = 1.07 ms, not ~0.34, so a
    # GEMM launch is ~4.1 us ((2.6 - 0.36 - 1.07) / 288), the MLP ~10 us x 48 = 0.49 ms now, and the saving
    # (0.49 - 0.29 to 0.38) x 0.7 = -0.08 to -0.14: written -0.1 ms at b32 (b1 unchanged: never profiled).
    "decode_mlp": Variant(
        "all + the decoding step's fc1 + erf GELU + fc2 in one Triton kernel per layer (the decoder's mlp), "
        "instead of two cuBLAS GEMMs and the GELU",
        {"fused_decoder": {"mlp": True}},
        estimate_ms_b32=0.1,
        estimate_ms_b1=0.2,
    ),
    # Issue 51 item 5, estimated before any GPU ran it. The separate erf GELU: 1.37 ms at b32 (12 launches at
    # 3.0 TB/s: 25,088 x 3,072 bf16 read and written, 3.7 GB). cuBLASLt's tanh epilogue measured -0.81 ms, i.e. its
    # GEMM cost 0.56 ms more than the plain one. fc1 is 12 x 118 GFLOP = 1.42 TFLOP: ~1.97 ms in cuBLAS (~90 % of the
    # measured 800 TFLOP/s); an untuned 128 x 128 x 64 Triton wgmma GEMM at 75-90 % of cuBLAS adds 0.2-0.65 ms, the
    # erf epilogue (~20 fp32 operations on each of 925 M outputs, mostly under the next tile's loads) 0.05-0.15 ms.
    # Net 1.37 - (0.25 to 0.8) = -0.57 to -1.12 ms, x 0.7: -0.4 to -0.8, written -0.55 ms. At b1 the GELU pass is
    # 784 x 3,072 (9.6 MB a layer, ~4 us + launch) x 12 = ~0.07 ms, and 168 Triton tiles on 132 SMs give back
    # ~0.02-0.03: -0.03 ms.
    "encoder_gelu_erf_epilogue": Variant(
        "all + the encoder MLP's fc1 bias + erf GELU in a Triton GEMM's epilogue (the model's GELU, unlike the "
        "cuBLASLt tanh epilogue of encoder_gelu_epilogue)",
        {"fused_encoder": {"add_norm": True, "gelu_erf_epilogue": True}},
        estimate_ms_b32=0.55,
        estimate_ms_b1=0.03,
    ),
    # Issue 51 item 2, estimated before any GPU ran it (docs/gpu.md, "Prepared for issue 51"). The 2026-11-26 b32
    # profile: the GN statistics kernel's 26 launches take 4.13 ms at ~2.0 TB/s, held to 2 resident CTAs per SM by
    # its registers while its grid assumed 8 (4.12 waves at level 0). At the 2.8 TB/s the apply kernel reaches on the
    # same tensors: 4.13 * 2.0 / 2.8 = 2.95 ms, -1.18 ms. The finalize's 26 one-warp launches (0.37 ms) become 26
    # small parallel ones of ~3 us: -0.29 ms. Together -1.47, written -1.45. At b1 (never profiled; the issue puts
    # the serial finalize at 0.5-1.0 ms of the call) the statistics move 1/32 of the bytes (~0.03 ms to gain) and
    # the finalize's merge shrinks from hundreds of serial steps to a few: -0.5 to -0.9 ms, written -0.6.
    "gn_persistent": Variant(
        "all + the GroupNorm statistics as a persistent kernel (grid of the CTAs its registers let stay resident, "
        "two row tiles in flight) and the parallel finalize (fused_vqgan group_norm='persistent')",
        {"fused_vqgan": {"group_norm": "persistent"}},
        estimate_ms_b32=1.45,
        estimate_ms_b1=0.6,
    ),
    # gn_persistent + one launch instead of three for the 14 norms whose groups fit a program (levels 3 and 4, the
    # mid block, norm_out: 28 launches fewer) which also read their input once instead of twice: b32 reads 10 x
    # 12.85 MB (level 4, 512 ch at 14 px) + 4 x 25.7 MB (level 3) = 231 MB less, 0.08 ms at 2.8 TB/s, and ~28 x 2 us of
    # launch gaps: -0.14 ms more. At b1, latency-bound, ~28 x 3 us: -0.1 ms more.
    "gn_single_kernel": Variant(
        "gn_persistent + one launch (statistics, finalize and apply) for the norms whose groups fit one program "
        "(fused_vqgan group_norm='single_kernel')",
        {"fused_vqgan": {"group_norm": "single_kernel"}},
        estimate_ms_b32=1.6,
        estimate_ms_b1=0.7,
    ),
    # Issue 51 item 3, estimated before any GPU ran it (docs/gpu.md, "Prepared for issue 51"). At b32 the VQGAN
    # encodes 64 images of 224 px: conv_in's output is 64 x 128 x 224^2 x 2 B = 822 MB. Now: conv_in 0.86 ms (the
    # CUTLASS sm80 kernel at 1.0 TB/s: 822 MB written, 51 MB of 8-channel input read); the first norm's statistics
    # pass reads the 822 MB and writes them again with the bias (the block's shortcut), 1.64 GB at the statistics
    # kernels' ~2.0 TB/s = 0.82 ms; the 8-channel padding (a fill and a copy) ~0.04 ms: 1.72 ms. Fused: 822 MB
    # written + 19 MB of images read at ~2.4 TB/s (untuned: 2.0-2.8; 64 x 5 chunks x 4 channel tiles = 1,280
    # programs, 4.8 waves at 2 blocks per SM) = 0.34 ms, + the images' channels-last copy ~0.02 ms: 0.36 ms.
    # Saves 1.36 ms, written as 1.3 (0.9-1.5: the last six estimates reached ~70 %). b1 (2 images, 25.7 MB):
    # conv ~0.027 + statistics pass 51 MB ~0.026 + two padding launches ~0.006 = 0.06 ms against ~0.016 ms: -0.04.
    "conv_in_stats": Variant(
        "all + conv_in as a Triton direct convolution on the images' 3 channels that adds its bias and writes the "
        "first norm's partial statistics (that norm's statistics pass skipped)",
        {"fused_vqgan": {"conv_in_stats": True}},
        estimate_ms_b32=1.3,
        estimate_ms_b1=0.04,
    ),
    # Every issue-51 option at once: the round's predicted end point. Not the sum of the estimates above: conv_in_stats
    # removes the first norm's statistics pass, which the GroupNorm paths speed up (~0.23 ms of overlap at b32). At
    # b32: GN single kernel 1.6 + conv_in_stats 1.3 - 0.23 + erf epilogue 0.55 + logits pick 0.25 + decode MLP 0.1
    # + split-K 0.1 = 3.7 ms, 36.6 -> ~32.9 ms (~23,300 TPS; the 30 ms target would need 2.9 ms more). At b1:
    # 0.7 + 0.04 + 0.03 + 0.05 + 0.2 + 0.15 = 1.2 ms, 5.78 -> ~4.6 ms (target 5.0).
    "issue51_all": Variant(
        "all + every issue-51 option together (GroupNorm single-kernel path, conv_in with statistics, erf GELU "
        "epilogue, logits pick, decode MLP, split-K attention)",
        {
            "fused_vqgan": {"group_norm": "single_kernel", "conv_in_stats": True},
            "fused_encoder": {"add_norm": True, "gelu_erf_epilogue": True},
            "fused_decoder": {"logits_pick": True, "mlp": True, "split_k_attention": True},
        },
        estimate_ms_b32=3.7,
        estimate_ms_b1=1.2,
    ),
    # Issue 52, prepared on a CPU (fake-quant) and not yet measured. Estimates from the 2026-11-26 profile: the
    # encoder GEMMs take 6.3 ms at b32 at ~90 % of bf16 peak; at 1.6-1.9x in FP8 they save 2.6-3.3 ms, less the
    # per-row quantisation of 4 activations per layer (~0.3 ms at b32 while no producing kernel writes e4m3):
    # -2.3 to -3.0 ms. The FP8 cross cache halves the ~2.5 GB of cross keys/values the 23 steps read (-0.4 ms)
    # only with an attention that reads e4m3; the reference path dequantises per step and may cost time instead.
    "fp8": Variant(
        "all + the procedure encoder's q/k/v/out, fc1, fc2 GEMMs in e4m3 (torch._scaled_mm, row-wise scales; "
        "estimate -2.3 to -3.0 ms at b32)",
        {"precision": "fp8"},
        estimate_ms_b32=2.65,
    ),
    "fp8_kv_cache": Variant(
        "fp8 + the decoder's cross-attention K/V cache in e4m3 (reference path: dequantised per step; estimate "
        "-0.4 ms once attention reads e4m3)",
        {"precision": "fp8", "kv_cache_dtype": "fp8"},
        estimate_ms_b32=3.05,
    ),
}
DEFAULT_VARIANTS = ("all", "readable_encoder", "encoder_gelu_epilogue", "baseline")
FP8_VARIANTS = ("all", "fp8", "fp8_kv_cache")  # the issue-52 comparison: --variants all,fp8,fp8_kv_cache
GN_VARIANTS = ("all", "gn_persistent", "gn_single_kernel")  # issue 51 item 2: --variants all,gn_persistent,...
# The issue-51 round in one GPU call: GPU_TUNE_ARGS="--variants issue51" (docs/gpu.md).
ISSUE_51_VARIANTS = (
    "all",
    "gn_persistent",
    "gn_single_kernel",
    "conv_in_stats",
    "encoder_gelu_erf_epilogue",
    "decode_logits_pick",
    "decode_mlp",
    "decode_split_k",
    "issue51_all",
    "compile",
)
# Names that --variants expands to a list of variants (none is a variant's name).
VARIANT_GROUPS = {"issue51": ISSUE_51_VARIANTS, "gn": GN_VARIANTS, "fp8_round": FP8_VARIANTS}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; unknown variants, bad batch lists and non-positive counts exit with status 2."""
    parser = argparse.ArgumentParser(prog="python bench/gpu_tune.py", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated names (see --list) or groups ({', '.join(VARIANT_GROUPS)})",
    )
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    parser.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    parser.add_argument("--preset", default="clevr", help="model preset with random weights (default clevr)")
    parser.add_argument("--k", type=int, default=2, help="keyframes (default 2)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per variant and batch (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls after the first (default 2)")
    parser.add_argument("--deadline", type=float, default=480.0, help="start no variant after this many seconds")
    parser.add_argument(
        "--profile-batches",
        default="1,32",
        help="profile one call per variant at each of these batches, every kernel recorded (default 1,32; 0: none)",
    )
    parser.add_argument("--top", type=int, default=12, help="kernels per printed profile table (default 12)")
    parser.add_argument("--out", type=Path, help="write the results JSON here")
    args = parser.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.variants = list(dict.fromkeys(n for name in names for n in VARIANT_GROUPS.get(name, (name,))))
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    try:
        args.batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
        args.profile_batches = sorted({int(b) for b in args.profile_batches.split(",") if b.strip()} - {0})
    except ValueError:
        parser.error(f"--batches and --profile-batches take comma-separated integers, got {args.batches!r}")
    if not args.batches or min(args.batches) < 1 or args.iters < 1 or args.warmup < 0 or args.k < 1:
        parser.error("batches, --iters and --k must be positive, --warmup not negative")
    if args.profile_batches and min(args.profile_batches) < 1:
        parser.error("--profile-batches must be positive (0 alone: no profile)")
    return args


def time_calls(fn: Callable[[], Any], iters: int, timer: Callable[[Callable[[], Any]], float]) -> list[float]:
    """Milliseconds of ``iters`` calls of ``fn``, each measured by ``timer`` (CUDA events on a GPU)."""
    return [timer(fn) for _ in range(iters)]


def cuda_event_timer(fn: Callable[[], Any]) -> float:
    """Device milliseconds of one call: CUDA events recorded around it, then a synchronisation."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def relative_difference(value: Any, reference: Any) -> float:
    """``||value - reference|| / ||reference||`` in fp64."""
    value, reference = value.double(), reference.double()
    return float((value - reference).norm() / reference.norm().clamp_min(1e-30))


def token_match(tokens: Any, reference: Any) -> float:
    """Fraction of equal token positions."""
    return float((tokens == reference).double().mean())


def run_variants(
    names: Sequence[str],
    measure: Callable[[str], dict[str, Any]],
    deadline_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Measure each variant in turn until the deadline; a failing variant is reported, not fatal.

    Returns:
        ``(results, not_started)``: per variant its measurement (or ``{"error": ...}``), and the names the deadline
        left out.
    """
    start, results = clock(), {}
    for index, name in enumerate(names):
        if clock() - start > deadline_s:
            return results, list(names[index:])
        try:
            results[name] = measure(name)
        except Exception as exc:  # noqa: BLE001 - one broken variant must not cost the others' figures
            results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    return results, []


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def compact_table(results: dict[str, dict[str, Any]], batches: Sequence[int]) -> str:
    """One line per variant: median ms per batch, TPS and MFU at the largest batch (also against the FP8 peak where
    FP8 runs), the gate, the setup time."""
    top = max(batches)
    header = ["variant"] + [f"b{b} ms" for b in batches]
    header += [f"b{top} TPS", "MFU", "MFU fp8", "SM MHz", "mem rel", "tokens", "setup s"]
    rows = [header]
    for name, result in results.items():
        if "error" in result:
            rows.append([name, f"failed: {result['error']}"])
            continue
        per_batch = result.get("batches", {})
        largest = per_batch.get(str(top), {})
        rows.append(
            [name]
            + [_cell(per_batch.get(str(b), {}).get("median_ms"), ".2f") for b in batches]
            + [
                _cell(largest.get("tps"), ",.0f"),
                _cell(largest.get("mfu"), ".1%"),
                _cell(largest.get("mfu_fp8_peak"), ".1%"),
                _cell(largest.get("sm_clock_mhz"), ".0f"),
                _cell(result.get("memory_rel_diff"), ".1e"),
                _cell(result.get("token_match"), ".1%"),
                _cell(sum(v.get("setup_s", 0.0) for v in per_batch.values()) or None, ".1f"),
            ]
        )
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(len(header))]
    lines = []
    for row in rows:
        if len(row) == 2 and row[1].startswith("failed"):
            lines.append(f"{row[0]:<{widths[0]}}  {row[1]}")
        else:
            lines.append(
                "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            )
    return "\n".join(lines)


def kernel_list(averages: Iterable[Any], calls: int = 1) -> dict[str, Any]:
    """Every kernel of ``calls`` profiled calls, per call, longest first: none is cut.

    Args:
        averages: ``torch.profiler``'s ``key_averages()`` rows (``key``, ``device_type``, ``self_device_time_total``
            in microseconds, ``count``). Only the device's rows are kernels: a CPU op's row carries the time of the
            kernels it launched, which the kernels' own rows hold already.

    Returns:
        ``{"device_ms", "launches", "kernels": [{"name", "ms_per_call", "launches_per_call"}, ...]}``.
    """
    from torch.autograd import DeviceType

    rows = [e for e in averages if e.device_type != DeviceType.CPU and e.self_device_time_total > 0]
    rows.sort(key=lambda e: e.self_device_time_total, reverse=True)
    kernels = [
        {"name": e.key, "ms_per_call": e.self_device_time_total / 1e3 / calls, "launches_per_call": e.count / calls}
        for e in rows
    ]
    return {
        "device_ms": sum(k["ms_per_call"] for k in kernels),
        "launches": sum(k["launches_per_call"] for k in kernels),
        "kernels": kernels,
    }


def kernel_table(name: str, batch: int, profile: dict[str, Any], top: int) -> str:
    """A variant's ``top`` longest kernels at one batch (ms per call, launches per call, name), and what the rest
    hold: the results JSON keeps every row."""
    kernels = profile["kernels"]
    lines = [f"kernels, {name}, b{batch}: {profile['device_ms']:.3f} ms in {profile['launches']:.0f} launches"]
    for k in kernels[:top]:
        lines.append(f"  {k['ms_per_call']:8.3f} ms  {k['launches_per_call']:6.0f}x  {k['name'][:100]}")
    rest = kernels[top:]
    if rest:
        rest_ms = sum(k["ms_per_call"] for k in rest)
        lines.append(f"  {rest_ms:8.3f} ms  in {len(rest)} more kernels (every one in the results JSON)")
    return "\n".join(lines)


NO_NVML = "gpu_tune: NVML is not available (pip install nvidia-ml-py): the SM clock is not recorded"


def clock_fields(summary: dict[str, float] | None) -> dict[str, float | None]:
    """The SM clock of one batch's timed calls from a :class:`telemetry.GPUTelemetry` summary (None: no NVML)."""
    if summary is None:
        return {"sm_clock_mhz": None}
    return {
        "sm_clock_mhz": summary.get("sm_clock_mhz_mean"),
        "sm_clock_mhz_min": summary.get("sm_clock_mhz_min"),
        "sm_clock_max_mhz": summary.get("sm_clock_max_mhz"),
        "power_w": summary.get("power_w_mean"),
    }


def clocks_missing(results: dict[str, dict[str, Any]]) -> bool:
    """Whether any measured batch went without an SM clock (then the run says :data:`NO_NVML` once)."""
    return any(
        batch.get("sm_clock_mhz") is None for result in results.values() for batch in result.get("batches", {}).values()
    )


# -- the GPU side ----------------------------------------------------------------------------------------------------


class TuneSession:
    """The model, the images, the fp32 oracle memory and the first variant's tokens, shared by every variant."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from procap.core.config import get_preset
        from procap.model.procap import ProCap

        self.args, self.device = args, torch.device("cuda")
        config = get_preset(args.preset, num_keyframes=args.k, max_caption_len=STEPS + 1)
        torch.manual_seed(0)
        with torch.device(self.device):
            self.model = ProCap(config).eval().requires_grad_(False)
        size = config.image_size
        generator = torch.Generator(device=self.device).manual_seed(0)
        top = max(args.batches + args.profile_batches)
        self.images = tuple(torch.rand(top, 3, size, size, device=self.device, generator=generator) for _ in range(2))
        matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        saved = (matmul.allow_tf32, cudnn.allow_tf32)
        matmul.allow_tf32 = cudnn.allow_tf32 = False
        with torch.no_grad():
            self.oracle_memory = self.model.memory(*self.images)
        matmul.allow_tf32, cudnn.allow_tf32 = saved
        self.flops_per_pair = self._model_flops()
        self.reference_tokens: Any = None

    def _model_flops(self) -> float:
        """Model FLOPs per pair, counted on the reference graph (the model's encoder and decode step, fp32)."""
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        from procap.fast import Captioner
        from procap.kernels.attention import use_backend

        counter = Captioner(
            self.model, None, device=self.device, dtype=torch.float32, max_len=STEPS + 1, batch_sizes=(1,),
            use_graphs=False, attention_backend="math", fused_vqgan=False,
        )  # fmt: skip
        with use_backend("math"), FlopCounterMode(display=False) as flops:
            counter.generate(self.images[0][:1], self.images[1][:1])
        return float(flops.get_total_flops())

    def measure(self, name: str) -> dict[str, Any]:
        import torch
        from telemetry import GPUTelemetry, mfu  # bench/ is on sys.path (see the end of this file)

        from procap.fast import Captioner

        variant, args = VARIANTS[name], self.args
        try:
            options = copy.deepcopy(variant.captioner)
            captioner = Captioner(
                self.model, None, device=self.device, dtype=torch.bfloat16, max_len=STEPS + 1,
                batch_sizes=tuple(sorted(set(args.batches + args.profile_batches))), copy_model=True, **options,
            )  # fmt: skip
            result: dict[str, Any] = {
                "description": variant.description,
                "estimate_ms_b32": variant.estimate_ms_b32,
                "estimate_ms_b1": variant.estimate_ms_b1,
                "batches": {},
            }
            torch.cuda.reset_peak_memory_stats(self.device)
            for batch in args.batches:
                before, after = (image[:batch] for image in self.images)
                call = functools.partial(captioner.generate, before, after)
                start = time.perf_counter()
                tokens = call()
                torch.cuda.synchronize(self.device)
                setup_s = time.perf_counter() - start
                for _ in range(args.warmup):
                    call()
                with GPUTelemetry(self.device, interval=0.01) as telemetry:
                    ms = statistics.median(time_calls(call, args.iters, cuda_event_timer))
                pairs_per_s = batch / (ms / 1e3)
                result["batches"][str(batch)] = {
                    "median_ms": ms,
                    "tps": pairs_per_s * STEPS,
                    "mfu": mfu(self.flops_per_pair, pairs_per_s, self.device),
                    "mfu_fp8_peak": (
                        mfu(self.flops_per_pair, pairs_per_s, self.device, "fp8")
                        if options.get("precision") == "fp8"
                        else None
                    ),
                    "setup_s": setup_s,
                    **clock_fields(telemetry.summary()),
                }
            result["peak_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
            with torch.no_grad():
                memory = captioner.memory(*self.images)
            result["memory_rel_diff"] = relative_difference(memory, self.oracle_memory)
            if self.reference_tokens is None:
                self.reference_tokens = tokens
            result["token_match"] = (
                token_match(tokens, self.reference_tokens) if tokens.shape == self.reference_tokens.shape else None
            )
            result["kernels"] = {str(b): self._profile(captioner, b) for b in args.profile_batches}
            return result
        finally:
            torch.cuda.empty_cache()

    def _profile(self, captioner: Any, batch: int) -> dict[str, Any]:
        import torch
        from torch.profiler import ProfilerActivity, profile

        before, after = (image[:batch] for image in self.images)
        captioner.generate(before, after)  # this batch's graph exists before the trace
        torch.cuda.synchronize(self.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            captioner.generate(before, after)
            torch.cuda.synchronize(self.device)
        return kernel_list(prof.key_averages())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, variant in VARIANTS.items():
            estimate = "" if variant.estimate_ms_b32 is None else f" [estimate: -{variant.estimate_ms_b32} ms at b32"
            if estimate and variant.estimate_ms_b1 is not None:
                estimate += f", -{variant.estimate_ms_b1} ms at b1"
            print(f"{name:<22} {variant.description}{estimate}{']' if estimate else ''}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_tune: needs a CUDA GPU (argument handling and tables are tested on the CPU)", file=sys.stderr)
        return 2
    started = time.monotonic()
    session = TuneSession(args)
    remaining = args.deadline - (time.monotonic() - started)
    results, not_started = run_variants(args.variants, session.measure, remaining)
    report = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "preset": args.preset,
        "k": args.k,
        "batches": args.batches,
        "flops_per_pair": session.flops_per_pair,
        "variants": results,
        "not_started": not_started,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
        os.replace(tmp, args.out)
    for name, result in results.items():
        for batch, profile in result.get("kernels", {}).items():
            print(kernel_table(name, int(batch), profile, args.top))
    if clocks_missing(results):
        print(NO_NVML)
    if not_started:
        print(f"gpu_tune: the deadline left out {', '.join(not_started)}")
    print(compact_table(results, args.batches))
    return 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]  # bench/telemetry.py, and procap from this checkout
    sys.exit(main())
