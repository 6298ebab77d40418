"""`procap prepare`: synthesize, score and cache the procedures of a dataset split (stage-1 data)."""

from __future__ import annotations

import argparse

from procap.core.config import FRAME_SIMILARITIES, GENERATED_FRAME_COUNTS
from procap.data.datasets import DATASETS, SPLITS

HELP = "Build the procedure cache: interpolated frames, confidence scores and VQ codes in HDF5."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_data_arguments(parser)
    _add_procedure_arguments(parser)
    _add_work_arguments(parser)


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The "data and cache" group: which pairs are read and where the cache goes."""
    group = parser.add_argument_group("data and cache")
    group.add_argument("--dataset", required=True, choices=sorted(DATASETS), help="dataset layout under --root")
    group.add_argument("--root", required=True, help="dataset directory")
    group.add_argument("--out", required=True, help="cache directory (created; an existing one is resumed)")
    group.add_argument(
        "--split",
        action="append",
        choices=SPLITS,
        help="split(s) to prepare, repeatable (default: train)",
    )
    group.add_argument("--limit", type=int, help="only the first N pairs (N >= 1; quick runs)")
    group.add_argument(
        "--allow-size-mismatch",
        dest="allow_size_mismatch",
        action="store_true",
        help="resize before/after of different sizes instead of stopping",
    )
    group.add_argument("--compression", choices=("gzip", "lzf"), help="HDF5 compression (default: none)")


def _add_procedure_arguments(parser: argparse.ArgumentParser) -> None:
    """The "procedures" group: how the frames are made, scored and stored."""
    group = parser.add_argument_group("procedures")
    group.add_argument(
        "--frames", type=int, default=7, choices=GENERATED_FRAME_COUNTS, help="l, generated frames per pair (default 7)"
    )
    group.add_argument(
        "--size", type=int, default=None, help="stored frame size S (default: the --vqgan's image size; 224 for taming)"
    )
    group.add_argument(
        "--recursive",
        dest="direct",
        action="store_false",
        help="recursive midpoints as in the paper (default: all l frames from one flow, faster)",
    )
    group.add_argument(
        "--similarity",
        default="vqgan",
        choices=FRAME_SIMILARITIES,
        help="frame similarity for the confidence score (default vqgan)",
    )
    group.add_argument("--scores-file", dest="scores_file", help="the authors' similarity JSON (--similarity scores)")
    group.add_argument("--dinov2-weights", dest="dinov2_weights", help="DINOv2 ViT-L/14 weights (needs timm)")
    group.add_argument(
        "--vqgan",
        help="VQGAN weights (.safetensors from `procap vqgan`, or a taming .ckpt); "
        "also stores the VQ codes of every frame",
    )
    group.add_argument(
        "--codes",
        dest="store_codes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="store the VQ codes of every frame (default on; --no-codes leaves them out)",
    )


def _add_work_arguments(parser: argparse.ArgumentParser) -> None:
    """The "work" group: processes, device, shards and progress."""
    group = parser.add_argument_group("work")
    group.add_argument("--workers", type=int, default=1, help="processes synthesizing frames (default 1)")
    group.add_argument("--device", help="device for the similarity model and VQGAN (default: cuda if available)")
    group.add_argument(
        "--shard",
        help="I/N: build only pairs I, I+N, I+2N ... into OUT/shards/I-of-N (0 <= I < N; one per machine or "
        "process), then join them with --merge. Under torchrun each rank takes its shard and rank 0 merges",
    )
    group.add_argument(
        "--merge",
        action="store_true",
        help="join OUT/shards/*-of-N into the cache OUT, checking every pair is there exactly once (give the same "
        "--dataset, --root, --split and --limit as the shards)",
    )
    group.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bars (default on)"
    )


def check_args(args: argparse.Namespace) -> None:
    """Ranges, paths and flag combinations, before anything is loaded or written."""
    from procap.core import validate
    from procap.core.errors import ProCapError

    validate.number(args.workers, "--workers", minimum=1, maximum=validate.MAX_WORKERS)
    validate.number(args.limit, "--limit", minimum=1)
    validate.number(args.size, "--size", minimum=16, maximum=4096)
    validate.input_dir(args.root, "--root")
    validate.output_dir(args.out, "--out")
    if args.shard is not None:
        validate.parse_shard(args.shard)
        if args.merge:
            raise ProCapError("--shard builds one shard and --merge joins them; pass one of the two")
    if args.merge:
        return  # the similarity and VQGAN settings come from the shards' manifests
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
    check_args(args)  # before the pipeline's imports, which bring torch: a wrong argument fails in the first second
    from procap.procedure.pipeline import options_from_args, prepare
    from procap.train.distributed import env_context

    if args.merge:
        return _merge(args)
    if args.size is None:
        args.size = default_size(args.vqgan)
    opts = options_from_args(args)
    ctx = env_context()
    if ctx.enabled and opts.shard is None:  # torchrun: one shard per rank, rank 0 merges when all are done
        opts.shard = (ctx.rank, ctx.world)
    stats = prepare(opts)
    where = args.out if opts.shard is None else f"{args.out} shard {opts.shard[0]}/{opts.shard[1]}"
    print(
        f"procedure cache {where}: {stats['written']} pairs written, {stats['skipped']} already done, "
        f"{stats['total']} in total"
    )
    if ctx.enabled and args.shard is None:
        _wait_for_all_ranks()
        if ctx.is_main:
            return _merge(args)
    return 0


def _wait_for_all_ranks() -> None:
    """Barrier over the torchrun job (gloo, CPU) with a timeout long enough for the slowest shard (a week)."""
    import torch

    from procap.train import distributed

    ctx, _ = distributed.setup(torch.device("cpu"), timeout_minutes=7 * 24 * 60)
    distributed.barrier(ctx)
    distributed.teardown()


def _merge(args: argparse.Namespace) -> int:
    from procap.procedure.pipeline import options_from_args, prepare_pairs
    from procap.procedure.shards import merge_shards

    args.size = args.size or 224  # not used by a merge; PrepareOptions wants one
    opts = options_from_args(args)
    pairs = prepare_pairs(opts)
    pairs = pairs[: opts.limit] if opts.limit is not None else pairs
    stats = merge_shards(opts.out, pairs, opts.dataset)
    print(f"procedure cache {args.out}: merged {stats['merged']} pairs from {stats['shards']} shards")
    return 0
