"""`procap vocab`: build a word vocabulary from a dataset's training captions."""

from __future__ import annotations

import argparse

from procap.data.datasets import DATASETS, SPLITS

HELP = "Build the caption vocabulary (word -> index JSON) from a dataset's training split."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=sorted(DATASETS), help="benchmark layout of --root")
    parser.add_argument("--root", required=True, help="dataset root folder")
    parser.add_argument("--out", required=True, help="vocabulary JSON to write")
    parser.add_argument(
        "--min-count",
        type=int,
        default=None,
        help="keep words seen at least this often (default: the dataset's, "
        + ", ".join(f"{name} {spec.min_count}" for name, spec in sorted(DATASETS.items()))
        + ")",
    )
    parser.add_argument(
        "--split", default="train", choices=SPLITS, help="split whose captions are counted (default train)"
    )


def run(args: argparse.Namespace) -> int:
    from procap.core import validate
    from procap.data import Vocabulary, load_split
    from procap.data.vocab import SPECIALS, tokenize

    validate.number(args.min_count, "--min-count", minimum=1)
    validate.output_file(args.out, "--out")
    pairs = load_split(args.dataset, args.root, args.split)
    min_count = args.min_count if args.min_count is not None else DATASETS[args.dataset].min_count
    captions = [c for pair in pairs for c in pair.captions]
    vocab = Vocabulary.build(captions, min_count=min_count)
    if len(vocab) == len(SPECIALS):  # every caption would encode as [UNK]: a model could learn no word
        from collections import Counter

        from procap.core.errors import ProCapError

        counts = Counter(w for c in captions for w in tokenize(c) if w not in SPECIALS)
        most = f"the most frequent word occurs {counts.most_common(1)[0][1]} times" if counts else "it has no words"
        raise ProCapError(
            f"--min-count {min_count} keeps no word of the {args.split} captions of {args.root} ({most}); "
            "lower --min-count."
        )
    vocab.save(args.out)
    print(f"wrote {len(vocab)} entries ({len(vocab) - len(SPECIALS)} words, min count {min_count}) to {args.out}")
    return 0
