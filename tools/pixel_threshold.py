"""How far the share of changed pixels alone tells a CLEVR-Change benchmark's change pairs from its distractors.

    python tools/pixel_threshold.py DATA [DATA ...] [--tolerance 16] [--splits val test]

For each scene of the splits, the share of pixels whose largest channel difference between the before image and the
after image exceeds the tolerance (out of 255), for the change pair and for the distractor pair; then the accuracy
of the best single threshold on that share. A benchmark where it is near 100 % can be solved without looking at
objects; docs/training.md ("Which benchmark by default") quotes it for the demo's two viewpoints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from procap.core.errors import ProCapError


def changed_share(before: Path, after: Path, tolerance: int) -> float:
    """The fraction of pixels that differ by more than ``tolerance`` (0-255) in some channel."""
    a = np.asarray(Image.open(before).convert("RGB"), dtype=np.int16)
    b = np.asarray(Image.open(after).convert("RGB"), dtype=np.int16)
    return float((np.abs(a - b).max(axis=-1) > tolerance).mean())


def best_threshold_accuracy(changes: list[float], distractors: list[float]) -> float:
    """The accuracy of the best rule "a change when the share is above t" (or below t), over every t."""
    values = np.array(changes + distractors)
    is_change = np.array([True] * len(changes) + [False] * len(distractors))
    cuts = np.concatenate([[-1.0], np.unique(values)])
    above = np.array([((values > t) == is_change).mean() for t in cuts])
    return float(max(above.max(), (1.0 - above).max()))


def measure(root: Path, splits: list[str], tolerance: int) -> dict[str, float]:
    from procap.data.datasets import load_split

    pairs = [pair for split in splits for pair in load_split("clevr-change", root, split)]
    changes = [changed_share(p.before_path, p.after_path, tolerance) for p in pairs if p.change_type != "no_change"]
    distractors = [changed_share(p.before_path, p.after_path, tolerance) for p in pairs if p.change_type == "no_change"]
    return {
        "scenes": len(changes),
        "distractors": len(distractors),
        "median_change": float(np.median(changes)),
        "median_distractor": float(np.median(distractors)),
        "best_threshold_accuracy": best_threshold_accuracy(changes, distractors),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="+", type=Path, help="CLEVR-Change folders (procap synth --out)")
    parser.add_argument("--tolerance", type=int, default=16, help="per-channel difference counted as changed")
    parser.add_argument("--splits", nargs="+", default=["val", "test"], help="splits to measure (default val test)")
    args = parser.parse_args(argv)
    for root in args.data:
        try:
            r = measure(root, args.splits, args.tolerance)
        except (OSError, ValueError, ProCapError) as error:
            print(f"error: {root}: {error}", file=sys.stderr)
            return 2
        print(
            f"{root}: {r['scenes']} scenes, changed pixels (median) {100 * r['median_change']:.1f} % in change "
            f"pairs, {100 * r['median_distractor']:.1f} % in distractors; best single threshold "
            f"{100 * r['best_threshold_accuracy']:.1f} %"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
