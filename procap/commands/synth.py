"""`procap synth`: write the synthetic CLEVR-Change-format benchmark."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from procap.core.config import VIEWPOINTS
from procap.core.errors import ProCapError

HELP = "Generate the synthetic CLEVR-like change-captioning benchmark (CLEVR-Change layout)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output folder (images/, sc_images/, nsc_images/, JSON files)")
    parser.add_argument("--scenes", type=int, default=1000, help="number of scenes (default 1000)")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels (default 64)")
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed; output is deterministic for a seed (default 0)"
    )
    parser.add_argument("--workers", type=int, default=1, help="rendering processes (default 1)")
    parser.add_argument(
        "--viewpoint",
        choices=VIEWPOINTS,
        default="none",
        help="camera and light change within a pair: none (the change pair keeps the before view; default), "
        "distractor (the change pair's after image is jittered like a distractor's), strong (larger shifts and "
        "zooms for both kinds of pair)",
    )
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bars (default on)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the synthetic benchmark already in --out (without it a non-empty --out is refused)",
    )


def run(args: argparse.Namespace) -> int:
    from procap.core import validate
    from procap.data.synthetic import MAX_SCENES, MAX_SIZE, generate

    validate.number(args.scenes, "--scenes", minimum=1, maximum=MAX_SCENES)
    validate.number(args.size, "--size", minimum=16, maximum=MAX_SIZE)
    validate.number(args.workers, "--workers", minimum=1, maximum=validate.MAX_WORKERS)
    validate.seed(args.seed, "--seed")  # NumPy refuses negative seeds
    validate.output_dir(args.out, "--out")
    entries = sorted(p.name for p in Path(args.out).iterdir()) if Path(args.out).is_dir() else []
    if entries and not args.overwrite:
        raise ProCapError(
            f"--out {args.out} is not empty (it holds {entries[0]}); pass --overwrite to replace the benchmark "
            "in it, or choose an empty folder."
        )
    start = time.perf_counter()
    splits = generate(
        args.out,
        args.scenes,
        args.size,
        args.seed,
        workers=args.workers,
        progress=args.progress,
        viewpoint=args.viewpoint,
    )
    sizes = ", ".join(f"{name} {len(indices)}" for name, indices in splits.items())
    print(f"wrote {args.scenes} scenes ({sizes}) to {args.out} in {time.perf_counter() - start:.1f} s")
    return 0
