"""`procap score`: BLEU-4 / METEOR / ROUGE-L / CIDEr of predictions against references."""

from __future__ import annotations

import argparse
import json

from procap.errors import ProCapError

HELP = "Score predicted captions against references (BLEU-4, METEOR, ROUGE-L, CIDEr)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pred", required=True, help="COCO-style results [{image_id, caption}] or {id: caption}")
    parser.add_argument("--refs", required=True, help="{id: [reference captions]}")
    parser.add_argument("--types", default=None, help="optional {id: change type} for a per-type breakdown")
    parser.add_argument(
        "--metrics",
        default="bleu,meteor,rouge,cider",
        help="comma-separated subset of BLEU-4,METEOR,ROUGE-L,CIDEr, any spelling (METEOR needs Java)",
    )
    parser.add_argument("--out", default=None, help="write the scores as JSON here")


def run(args: argparse.Namespace) -> int:
    from procap.data.records import read_json
    from procap.evaluate import format_table, read_predictions, read_references, score
    from procap.files import atomic_write_json

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    types = read_json(args.types, "change-type file") if args.types else None
    if types is not None and not isinstance(types, dict):
        raise ProCapError(f"change-type file {args.types} must be an object from id to change type.")
    results = score(read_predictions(args.pred), read_references(args.refs), metrics, types)
    print(format_table(results))
    if args.out:
        atomic_write_json(args.out, results, indent=2)
    else:
        print(json.dumps({k: v for k, v in results.items() if k != "by_type"}))
    return 0
