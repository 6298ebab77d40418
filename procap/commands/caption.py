"""`procap caption --ckpt C BEFORE AFTER [BEFORE AFTER ...]`: caption image pairs with procap.fast.Captioner."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from procap import validate
from procap.commands.hub_args import add_hub_arguments, checkpoint_file
from procap.config import COMPUTE_DTYPES, MAX_BEAMS
from procap.errors import ProCapError

HELP = "Caption (before, after) image pairs with a trained checkpoint (fast path: bf16 + CUDA graphs on GPU)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="BEFORE AFTER [BEFORE AFTER ...] image files")
    parser.add_argument(
        "--ckpt",
        required=True,
        help="a checkpoint: a .safetensors file, a pretrained folder or hf://owner/repo[@revision] (written by procap train or save_pretrained)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list of {before, after, caption}")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument(
        "--dtype",
        default=None,
        choices=COMPUTE_DTYPES,
        help="compute dtype (default: bf16 on CUDA, fp32 on CPU)",
    )
    parser.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="caption length including BOS (default: the checkpoint's max_caption_len)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per batch (default 32)")
    add_beam_arguments(parser)
    add_hub_arguments(parser)


def add_beam_arguments(parser: argparse.ArgumentParser) -> None:
    """``--beams`` and ``--length-penalty`` (shared with ``procap evaluate``)."""
    parser.add_argument(
        "--beams", type=int, default=1, help=f"beam search with N beams, 1 to {MAX_BEAMS} (default 1: greedy)"
    )
    parser.add_argument(
        "--length-penalty",
        type=float,
        default=1.0,
        help="beam search ranks captions by log-probability / length ** this (default 1.0)",
    )


def pairs_from_paths(paths: list[str]) -> list[tuple[Path, Path]]:
    """Group BEFORE AFTER paths into pairs, checking that every one is an existing file."""
    if len(paths) % 2:
        raise ProCapError(f"caption needs BEFORE AFTER pairs of images, got an odd number of paths ({len(paths)})")
    files = [validate.input_file(path, "image file") for path in paths]
    return list(zip(files[0::2], files[1::2]))


def run(args: argparse.Namespace) -> int:
    pairs = pairs_from_paths(args.images)
    validate.device(args.device)
    validate.number(args.batch_size, "--batch-size", minimum=1)
    validate.number(args.max_len, "--max-len", minimum=2)
    validate.number(args.beams, "--beams", minimum=1, maximum=MAX_BEAMS)

    checkpoint = checkpoint_file(args)
    from procap.batch_memory import check_checkpoint_batch

    # a batch is never larger than the pairs given (a CUDA bucket of --batch-size rows would be allocated whole)
    device = validate.device(args.device)
    batch_size = check_checkpoint_batch(checkpoint, args.batch_size, len(pairs), device, "pairs given", "caption")
    from procap.fast import Captioner
    from procap.model.decoding import decoding_strategy

    captioner = Captioner.from_checkpoint(
        checkpoint,
        device=args.device,
        dtype=args.dtype,
        max_len=args.max_len,
        batch_sizes=sorted({1, 8, min(32, batch_size), batch_size}),
        strategy=decoding_strategy(args.beams, args.length_penalty),
    )
    captions: list[str] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        captions += captioner([b for b, _ in chunk], [a for _, a in chunk])
    if args.json:
        print(
            json.dumps(
                [{"before": str(b), "after": str(a), "caption": c} for (b, a), c in zip(pairs, captions)], indent=2
            )
        )
    else:
        for caption in captions:
            print(caption)
    return 0
