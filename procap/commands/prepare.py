"""`procap prepare`: synthesize, score and cache the procedures of a dataset split (stage-1 data)."""

from __future__ import annotations

import argparse

from procap.data.datasets import DATASETS

HELP = "Build the procedure cache: interpolated frames, confidence scores and VQ codes in HDF5."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=sorted(DATASETS), help="dataset layout under --root")
    parser.add_argument("--root", required=True, help="dataset directory")
    parser.add_argument("--out", required=True, help="cache directory (created; an existing one is resumed)")
    parser.add_argument(
        "--split",
        action="append",
        choices=("train", "val", "test"),
        help="split(s) to prepare, repeatable (default: train)",
    )
    parser.add_argument("--frames", type=int, default=7, choices=(3, 7, 15), help="l, generated frames per pair")
    parser.add_argument(
        "--size", type=int, default=None, help="stored frame size S (default: the --vqgan's image size; 224 for taming)"
    )
    parser.add_argument(
        "--similarity",
        default="vqgan",
        choices=("vqgan", "dinov2", "scores"),
        help="frame similarity for the confidence score",
    )
    parser.add_argument("--scores-file", dest="scores_file", help="the authors' similarity JSON (--similarity scores)")
    parser.add_argument("--dinov2-weights", dest="dinov2_weights", help="DINOv2 ViT-L/14 weights (needs timm)")
    parser.add_argument(
        "--vqgan",
        help="VQGAN weights (.safetensors from `procap vqgan`, or a taming .ckpt); "
        "also stores the VQ codes of every frame",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes synthesizing frames")
    parser.add_argument("--device", help="device for the similarity model and VQGAN (default: cuda if available)")
    parser.add_argument("--compression", choices=("gzip", "lzf"), help="HDF5 compression (default: none)")
    parser.add_argument(
        "--allow-size-mismatch",
        dest="allow_size_mismatch",
        action="store_true",
        help="resize before/after of different sizes instead of stopping",
    )
    parser.add_argument(
        "--recursive",
        dest="direct",
        action="store_false",
        help="recursive midpoints as in the paper (default: all l frames from one flow, faster)",
    )
    parser.add_argument(
        "--no-codes", dest="store_codes", action="store_false", help="do not store the VQ codes of every frame"
    )
    parser.add_argument("--limit", type=int, help="only the first N pairs (N >= 1; quick runs)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def check_args(args: argparse.Namespace) -> None:
    """Ranges, paths and flag combinations, before anything is loaded or written."""
    from procap import validate
    from procap.errors import ProCapError

    validate.number(args.workers, "--workers", minimum=1)
    validate.number(args.limit, "--limit", minimum=1)
    validate.number(args.size, "--size", minimum=16, maximum=4096)
    validate.input_dir(args.root, "--root")
    validate.output_dir(args.out, "--out")
    needs = {"vqgan": "vqgan", "dinov2": "dinov2_weights", "scores": "scores_file"}[args.similarity]
    if not getattr(args, needs):
        flag = f"--{needs.replace('_', '-')}"
        raise ProCapError(f"--similarity {args.similarity} needs {flag} FILE (nothing is downloaded).")
    for name in ("vqgan", "dinov2_weights", "scores_file"):
        if getattr(args, name):
            validate.input_file(getattr(args, name), f"--{name.replace('_', '-')}")
    if args.device:
        validate.device(args.device)


def default_size(vqgan: str | None) -> int:
    """The VQGAN's image size: a `procap vqgan` file records it; a taming checkpoint is the paper's 224 px."""
    if vqgan and vqgan.endswith(".safetensors"):
        from procap.model.vqgan import VQGAN

        return VQGAN.read_config(vqgan).resolution
    return 224


def run(args: argparse.Namespace) -> int:
    from procap.procedure.pipeline import options_from_args, prepare

    check_args(args)
    if args.size is None:
        args.size = default_size(args.vqgan)
    stats = prepare(options_from_args(args))
    print(
        f"procedure cache {args.out}: {stats['written']} pairs written, {stats['skipped']} already done, "
        f"{stats['total']} in total"
    )
    return 0
