"""`procap imagine --ckpt C BEFORE AFTER [--out strip.png] [--sample --seed N]`: draw the imagined procedure."""

from __future__ import annotations

import argparse
from pathlib import Path

from procap.commands.hub_args import CHECKPOINT_HELP, add_hub_arguments, checkpoint_file, local_checkpoint
from procap.core.errors import ProCapError

HELP = "Decode the procedure a checkpoint's encoder imagines between two images into a before | frames | after strip."
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
# --tile of imagine and procedure; the default is procap.viz.figures' (MIN_TILE), which imports torch: --help does not
TILE_HELP = "side of each image in the strip, 8 to 2048 pixels (default: the images' own side, at least 128)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", metavar="BEFORE", help="the image before the change")
    parser.add_argument("after", metavar="AFTER", help="the image after the change")
    parser.add_argument("--ckpt", required=True, help=f"{CHECKPOINT_HELP}; stage 1 shows the paper's view")
    parser.add_argument("--out", default="strip.png", help="image to write (default strip.png)")
    parser.add_argument("--sample", action="store_true", help="draw each code from the MSM head instead of argmax")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --sample draw (default 0)")
    parser.add_argument(
        "--caption", default=None, help="condition the encoder on this caption, as in stage 1 (stage-1 checkpoints)"
    )
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--tile", type=int, default=None, help=TILE_HELP)
    add_hub_arguments(parser)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.suffix.lower() not in IMAGE_SUFFIXES:
        raise ProCapError(f"--out {out} must end in one of {', '.join(IMAGE_SUFFIXES)}")
    if args.tile is not None and not 8 <= args.tile <= 2048:
        raise ProCapError(f"--tile must be between 8 and 2048 pixels, got {args.tile}")
    from procap.core import validate

    local_checkpoint(args, "checkpoint file")
    for image in (args.before, args.after):
        validate.input_file(image, "image file")
    validate.output_file(out, "--out")
    validate.seed(args.seed, "--seed")
    device_name = validate.device(args.device) if args.device else "cpu"  # the first check that imports torch
    checkpoint = checkpoint_file(args, "checkpoint file")  # an hf:// checkpoint is fetched once all checks passed
    import torch

    from procap.core.files import atomic_write
    from procap.data.images import load_image
    from procap.loading.checkpoint import load_checkpoint
    from procap.viz.figures import check_imaginable, imagine

    device = torch.device(device_name)
    model, vocab, meta = load_checkpoint(checkpoint, map_location=device)
    check_imaginable(model)
    size = model.config.image_size
    before, after = load_image(args.before, size), load_image(args.after, size)
    generator = torch.Generator(device=device).manual_seed(args.seed) if args.sample else None
    stage = meta.get("extra", {}).get("stage")
    result = imagine(
        model, before, after, args.sample, generator, vocab=vocab, stage=stage, tile=args.tile, condition=args.caption
    )
    atomic_write(out, lambda tmp: result.strip.save(tmp, format=image_format(out)))
    k = result.codes.shape[0]
    how = f"sampled (seed {args.seed})" if args.sample else "most likely code"
    print(f"head: {result.head}")
    print(f"imagined {k} frames, {how}, mean probability of the chosen codes {result.probabilities.mean():.3f}")
    print(f"under the strip: {result.caption}")
    print(f"wrote {out} ({result.strip.width}x{result.strip.height})")
    return 0


def image_format(path: Path) -> str:
    """PIL format name for ``path``'s suffix (the temporary file has none)."""
    return {".jpg": "JPEG", ".jpeg": "JPEG"}.get(path.suffix.lower(), path.suffix.lower().lstrip(".").upper())
