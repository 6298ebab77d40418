"""`procap vocab`: build a word vocabulary from a dataset's training captions."""

from __future__ import annotations

import argparse

from procap.data.loaders import LOADERS

HELP = "Build the caption vocabulary (word -> index JSON) from a dataset's training split."
# The authors' thresholds: every word for CLEVR-Change, words seen 4+ times for Spot-the-Diff; Image-Editing-
# Request's requests are free-form, so rare words are dropped as for Spot-the-Diff.
DEFAULT_MIN_COUNT = {"clevr-change": 1, "spot-the-diff": 4, "image-editing-request": 4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=sorted(LOADERS), help="benchmark layout of --root")
    parser.add_argument("--root", required=True, help="dataset root folder")
    parser.add_argument("--out", required=True, help="vocabulary JSON to write")
    parser.add_argument(
        "--min-count",
        type=int,
        default=None,
        help="keep words seen at least this often (default: 1 CLEVR-Change, 4 otherwise)",
    )
    parser.add_argument("--split", default="train", help="split whose captions are counted (default train)")


def run(args: argparse.Namespace) -> int:
    from procap.data import Vocabulary, load_split

    pairs = load_split(args.dataset, args.root, args.split)
    min_count = args.min_count if args.min_count is not None else DEFAULT_MIN_COUNT[args.dataset]
    vocab = Vocabulary.build((c for pair in pairs for c in pair.captions), min_count=min_count)
    vocab.save(args.out)
    print(f"wrote {len(vocab)} entries ({len(vocab) - 8} words, min count {min_count}) to {args.out}")
    return 0
