"""`procap procedure --data ROOT --pair ID (--cache DIR | --vqgan CKPT) [--out strip.png]`: a pair's explicit
procedure: the l interpolated frames, each frame's confidence score as a bar, the k sampled keyframes outlined."""

from __future__ import annotations

import argparse
from pathlib import Path

from procap.commands.imagine import TILE_HELP
from procap.core.config import GENERATED_FRAME_COUNTS, KEYFRAME_SAMPLING
from procap.core.errors import ProCapError
from procap.data.datasets import DATASETS

HELP = "Draw a training pair's explicit procedure: interpolated frames, confidence bars, sampled keyframes outlined."
# what names a pair of each dataset (procap.data: ChangePair.id), for --pair's help and its error
PAIR_IDS = {
    "clevr-change": "the after image's file name",
    "image-editing-request": "its uid",
    "levir-cc": "its filename",
    "spot-the-diff": "its img_id",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="dataset root folder")
    parser.add_argument(
        "--pair",
        required=True,
        help="the pair's id ("
        + "; ".join(f"{name}: {what}" for name, what in PAIR_IDS.items())
        + "), e.g. CLEVR_semantic_000001.png",
    )
    parser.add_argument(
        "--dataset", default="clevr-change", choices=sorted(DATASETS), help="dataset layout (default clevr-change)"
    )
    parser.add_argument("--cache", help="procedure cache from `procap prepare` (default: synthesize the frames now)")
    parser.add_argument("--vqgan", help="VQGAN weights for the similarity scores when synthesizing (no --cache)")
    parser.add_argument(
        "--frames", type=int, default=7, choices=GENERATED_FRAME_COUNTS, help="l when synthesizing (default 7)"
    )
    parser.add_argument("--size", type=int, default=None, help="frame size when synthesizing (default: the VQGAN's)")
    parser.add_argument(
        "--recursive",
        dest="direct",
        action="store_false",
        help="recursive midpoints as in the paper when synthesizing (default: all l frames from one flow, faster)",
    )
    from procap.commands.cli_args import add_keyframes_argument

    add_keyframes_argument(parser, "keyframes to sample, k (default 2)", default=2)
    parser.add_argument(
        "--sampling", choices=KEYFRAME_SAMPLING, default="topk", help="keyframe sampling (default topk)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --sampling multinomial (default 0)")
    parser.add_argument("--out", default="procedure.png", help="image to write (default procedure.png)")
    parser.add_argument("--tile", type=int, default=None, help=TILE_HELP)
    parser.add_argument("--device", default=None, help="device of the VQGAN when synthesizing (default: cpu)")


def check_args(args: argparse.Namespace) -> None:
    """Paths, ranges and flag combinations, before anything is loaded or written (``--device``, which needs torch,
    is checked by :func:`run` once the pair is found)."""
    from procap.commands.imagine import IMAGE_SUFFIXES
    from procap.core import validate

    validate.input_dir(args.data, "--data")
    out = Path(args.out)
    if out.suffix.lower() not in IMAGE_SUFFIXES:
        raise ProCapError(f"--out {out} must end in one of {', '.join(IMAGE_SUFFIXES)}")
    validate.output_file(out, "--out")
    if args.tile is not None and not 8 <= args.tile <= 2048:
        raise ProCapError(f"--tile must be between 8 and 2048 pixels, got {args.tile}")
    validate.keyframe_count(args.num_keyframes, "--num-keyframes")
    validate.seed(args.seed, "--seed")
    validate.number(args.size, "--size", minimum=16, maximum=4096)
    if args.cache is not None:
        if not Path(args.cache).exists():
            raise ProCapError(f"--cache {args.cache} does not exist; build it with `procap prepare`.")
    elif args.vqgan is None:
        raise ProCapError("--cache DIR or --vqgan CKPT is needed: read a prepared procedure or synthesize one now.")
    else:
        validate.input_file(args.vqgan, "--vqgan")


def find_pair(dataset: str, root: str, pair_id: str):
    """The pair ``pair_id`` from any split of the dataset, or a one-sentence error naming ``--pair``."""
    from procap.data import load_split
    from procap.data.datasets import SPLITS

    holding: dict[str, list[str]] = {}  # role -> ids of the pairs whose image of that role has this file name
    for split in SPLITS:
        for pair in load_split(dataset, root, split):
            if pair.id == pair_id:
                return pair, split
            for role, path in (("before", pair.before_path), ("after", pair.after_path)):
                if Path(path).name == pair_id and pair.id not in holding.setdefault(role, []):
                    holding[role].append(pair.id)
    if holding:  # a file name given for a pair id: say which ids are wanted (CLEVR-Change: a before image's name)
        role, ids = next(iter(holding.items()))
        pairs = " and ".join(ids) if len(ids) <= 2 else f"{ids[0]}, {ids[1]} and {len(ids) - 2} more"
        raise ProCapError(
            f"--pair {pair_id} is the {role} image of {pairs}; a {dataset} pair is named by {PAIR_IDS[dataset]}: "
            f"give --pair {' or --pair '.join(ids[:2])}."
        )
    raise ProCapError(f"--pair {pair_id} is not a pair of {dataset} in {root} (no split lists it).")


def load_procedure(args: argparse.Namespace, pair):
    """(frames (l + 2, 3, S, S) uint8, s_bef, s_aft) from the cache or synthesized now, and where they came from."""
    from procap.viz.figures import procedure_from_cache, procedure_from_pair

    if args.cache is not None:
        from procap.procedure import ProcedureCache

        cache = ProcedureCache(args.cache)
        try:
            return (*procedure_from_cache(cache, pair.id), f"cache {args.cache}")
        except (OSError, KeyError, ValueError) as exc:  # h5py's errors for a file that is not HDF5 or is damaged
            raise ProCapError(f"--cache {args.cache} cannot be read as a procedure cache ({exc}).") from None
        finally:
            cache.close()
    import torch

    from procap.commands.prepare import default_size
    from procap.procedure import FlowInterpolator, VQGANSimilarity
    from procap.procedure.pipeline import load_vqgan

    device = torch.device(args.device or "cpu")
    size = args.size or default_size(args.vqgan)
    similarity = VQGANSimilarity(load_vqgan(args.vqgan, device), device)
    frames = procedure_from_pair(pair, FlowInterpolator(), similarity, args.frames, size, args.direct)
    return (*frames, f"synthesized now (optical flow, l={args.frames}, {size} px)")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    pair, split = find_pair(args.dataset, args.data, args.pair)  # reads the split lists: no torch yet
    if args.device:  # the one check that imports torch comes after those that do not
        from procap.core import validate

        validate.device(args.device)
    import torch

    from procap.commands.imagine import image_format
    from procap.core import validate
    from procap.core.files import atomic_write
    from procap.viz.figures import explicit_procedure, flat_scores_note

    frames, s_bef, s_aft, source = load_procedure(args, pair)
    count = frames.shape[0] - 2
    validate.keyframe_count(args.num_keyframes, "--num-keyframes", frames=count)
    generator = torch.Generator().manual_seed(args.seed) if args.sampling == "multinomial" else None
    caption = f"{pair.id} ({split}, {pair.change_type or 'pair'}): {pair.captions[0] if pair.captions else ''}"
    result = explicit_procedure(frames, s_bef, s_aft, args.num_keyframes, args.sampling, generator, args.tile, caption)
    out = Path(args.out)
    atomic_write(out, lambda tmp: result.strip.save(tmp, format=image_format(out)))
    print(f"pair {pair.id} ({split}), {count} frames from {source}")
    print("confidence: " + " ".join(f"P{i + 1}={w:.6f}" for i, w in enumerate(result.weights.tolist())))
    if flat_scores_note(result.weights):
        print(f"note: {flat_scores_note(result.weights)}")
    print(
        f"keyframes ({args.sampling}, k={args.num_keyframes}): " + " ".join(f"P{i}" for i in result.keyframes.tolist())
    )
    print(f"wrote {out} ({result.strip.width}x{result.strip.height})")
    return 0
