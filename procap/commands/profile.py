"""`procap profile --ckpt C` (or `--preset NAME`, random weights): a torch.profiler trace of a few captioning
batches; the Nsight commands printed.

The trace (Chrome JSON, open in chrome://tracing or https://ui.perfetto.dev) shows the NVTX / record_function
ranges ``procap.vqgan``, ``procap.encoder``, ``procap.prefill`` and ``procap.decode``. It profiles the pipeline
uncaptured: the same kernels launched one by one, because a replayed CUDA graph is one launch whose ranges were
recorded once, at capture. On a CPU there is no graph: the trace is the pipeline as the CPU runs it, and the Nsight
lines (for CUDA kernels) are printed to be run on a GPU machine, without a CPU ``--device``. The printed ``nsys`` line re-runs the workload as the Captioner runs it (the replayed
graph, per kernel with ``--cuda-graph-trace=node``); the two ``ncu`` lines run it uncaptured (``--no-graphs``) so that
their NVTX filters find the decoding loop (``ncu``) and the VQGAN and procedure encoder (``ncu-encoder``), with
``--clock-control none``: kernels at the clocks the timed runs have, not ncu's locked base clock. All pass
``--no-trace``, which keeps torch.profiler out of their way.

``--preset NAME`` profiles that preset's model with random weights (seed 0) instead of a checkpoint: kernel timings
depend on the shapes, not on the weights, so the fast path can be profiled before any model is trained (captions of
random weights are one token repeated; only the time counts).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from procap.commands.hub_args import CHECKPOINT_HELP, add_hub_arguments, checkpoint_file, local_checkpoint
from procap.core import validate
from procap.core.config import COMPUTE_DTYPES, PRESETS, get_preset
from procap.core.errors import ProCapError

# Each profiled batch adds its events to the trace held in memory and written as one JSON file.
MAX_PROFILED_STEPS = 1000

HELP = "Profile captioning batches with torch.profiler (Chrome trace) and print the nsys / ncu lines for a GPU."
# ncu reports on these ranges (procap.fast's NVTX annotations) besides the decoding loop
ENCODER_RANGES = ("procap.vqgan", "procap.encoder")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", default=None, help=f"{CHECKPOINT_HELP}; or --preset")
    parser.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS),
        help="profile this preset's model with random weights instead of a checkpoint (the timings depend on the "
        "shapes only)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per batch (default 32)")
    parser.add_argument(
        "--steps", type=int, default=3, help="profiled batches after one warm-up batch (default 3, at most 1000)"
    )
    parser.add_argument("--out", default="profiles", help="folder for the trace (default ./profiles)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument(
        "--dtype", default=None, choices=COMPUTE_DTYPES, help="compute dtype (default: bf16 on CUDA, fp32 on CPU)"
    )
    parser.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="caption length including BOS (default: the checkpoint's max_caption_len)",
    )
    parser.add_argument(
        "--no-trace", action="store_true", help="run the batches without torch.profiler (use under nsys / ncu)"
    )
    parser.add_argument(
        "--no-graphs",
        action="store_true",
        help="with --no-trace on CUDA: launch the pipeline kernel by kernel instead of replaying its CUDA graph "
        "(the torch.profiler trace always does; a CPU has no graphs)",
    )
    add_hub_arguments(parser)


def nsight_commands(args: argparse.Namespace) -> dict[str, str]:
    """The nsys and ncu command lines that profile this workload: ``nsys``, ``ncu`` (the decoding loop) and
    ``ncu-encoder`` (the VQGAN's and the procedure encoder's NVTX ranges)."""
    model = ["--preset", args.preset] if args.preset else ["--ckpt", str(args.ckpt)]
    base = [
        "procap",
        "profile",
        *model,
        "--batch-size",
        str(args.batch_size),
        "--steps",
        str(args.steps),
        "--no-trace",
    ]
    if args.max_len:
        base += ["--max-len", str(args.max_len)]
    if args.device and not args.device.startswith("cpu"):  # the Nsight tools profile CUDA kernels, never a CPU's
        base += ["--device", args.device]
    if args.dtype:
        base += ["--dtype", args.dtype]
    cmd = shlex.join(base)
    # --clock-control none: ncu otherwise locks the clocks at base, and its figures would not be the timed runs'
    ncu = "ncu --clock-control none --set full --launch-count 200 --nvtx"
    encoder = " ".join(f"--nvtx-include {name}/" for name in ENCODER_RANGES)
    return {
        # Per-kernel rows inside replayed CUDA graphs need --cuda-graph-trace=node.
        "nsys": f"nsys profile --trace=cuda,nvtx,cublas,cudnn --cuda-graph-trace=node -o procap_nsys --force-overwrite true {cmd}",
        # Kernels of the decoding loop only (NVTX push/pop range "procap.decode").
        "ncu": f"{ncu} --nvtx-include procap.decode/ -o procap_ncu {cmd} --no-graphs",
        # The VQGAN's and the encoder's kernels (either range), where most of a call's time goes.
        "ncu-encoder": f"{ncu} {encoder} -o procap_ncu_encoder {cmd} --no-graphs",
    }


def _export_trace(prof, out_dir: Path) -> Path:
    """Write the Chrome trace through a temporary file in ``out_dir`` and move it into place."""
    from procap.core.files import atomic_write

    return atomic_write(out_dir / f"procap_trace_{time.strftime('%Y%m%d-%H%M%S')}.json", prof.export_chrome_trace)


def _random_model(preset: str) -> Any:
    """The preset's model with random weights (seed 0), for profiling without a checkpoint."""
    import torch

    from procap.model.procap import ProCap

    torch.manual_seed(0)
    return ProCap(get_preset(preset))


def _captioning_batch(args: argparse.Namespace, checkpoint: Path | None) -> tuple[Any, Any]:
    """The Captioner to profile (the checkpoint's model, or with ``checkpoint`` None the preset's with random
    weights) and a function that captions one random batch and waits for the device."""
    import torch

    from procap.fast import Captioner

    # The trace profiles the pipeline uncaptured: inside a replayed graph no range is recorded (module docstring).
    uncaptured = {"use_graphs": False} if args.no_graphs or not args.no_trace else {}
    options = {
        "device": args.device,
        "dtype": args.dtype,
        "max_len": args.max_len,
        "batch_sizes": (args.batch_size,),
        **uncaptured,
    }
    if checkpoint is None:
        captioner = Captioner(_random_model(args.preset), None, copy_model=False, **options)
    else:
        captioner = Captioner.from_checkpoint(checkpoint, **options)
    size = captioner.config.image_size
    gen = torch.Generator().manual_seed(0)
    before, after = (torch.rand(args.batch_size, 3, size, size, generator=gen) for _ in range(2))

    def batch() -> None:
        captioner.generate(before, after)
        if captioner.device.type == "cuda":
            torch.cuda.synchronize(captioner.device)

    return captioner, batch


def _trace(args: argparse.Namespace, captioner: Any, batch: Any) -> None:
    """``args.steps`` batches under torch.profiler: the Chrome trace written, the top ops and Nsight lines printed."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if captioner.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(args.steps):
            batch()
    path = _export_trace(prof, Path(args.out))
    sort = "self_cuda_time_total" if captioner.device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=12))
    print(f"trace: {path} ({args.steps} batch(es) of {args.batch_size} on {captioner.device}, {captioner.dtype})")
    if captioner.device.type == "cuda":
        print(
            "the trace shows the pipeline uncaptured (each stage in its range); nsys below profiles the replayed graph"
        )
    else:
        print(
            f"the trace shows the pipeline as the {captioner.device.type.upper()} runs it, each stage in its range (no "
            "CUDA graph there to replay); nsys and ncu profile CUDA kernels: run the lines below on a machine with a GPU"
        )
    for tool, line in nsight_commands(args).items():
        print(f"{tool}: {line}")
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    validate.number(args.batch_size, "--batch-size", minimum=1)
    validate.number(args.steps, "--steps", minimum=1, maximum=MAX_PROFILED_STEPS)
    validate.caption_length(args.max_len, "--max-len")  # its ceiling is the model's, checked once loaded
    if (args.ckpt is None) == (args.preset is None):
        raise ProCapError("give --ckpt CHECKPOINT or --preset NAME (random weights), exactly one of them.")
    if args.ckpt is not None:
        local_checkpoint(args)
    if not args.no_trace:
        validate.output_dir(args.out, "--out")
    device = validate.device(args.device)  # the first check that imports torch: the others come before it
    from procap.train.batch_memory import check_batch, check_checkpoint_batch

    if args.preset:
        checkpoint = None
        check_batch(get_preset(args.preset), args.batch_size, "inference", device)
    else:
        checkpoint = checkpoint_file(args)
        check_checkpoint_batch(checkpoint, args.batch_size, None, device, "", "profile")
    captioner, batch = _captioning_batch(args, checkpoint)
    batch()  # warm-up: cuDNN autotuning and graph capture stay out of the trace
    if args.no_trace:
        for _ in range(args.steps):
            batch()
        print(f"ran {args.steps} batches of {args.batch_size} on {captioner.device} ({captioner.dtype})")
        return 0
    _trace(args, captioner, batch)
    return 0
