"""`procap score`: BLEU-1..4 / METEOR / ROUGE-L / CIDEr (and SPICE on request) of predictions against references.

References come from a ``{id: [captions]}`` file (``--refs``; ``procap evaluate`` writes one as
``references.json``) or straight from a dataset split
(``--dataset/--root/--split``, the ids ``procap evaluate`` writes into ``results.json``); CLEVR-Change splits
also give the per-change-type breakdown.
"""

from __future__ import annotations

import argparse
import json
import logging

from procap.core.errors import ProCapError
from procap.data.datasets import DATASETS, SPLITS
from procap.eval.metrics import METRICS_SPELLING_HELP

logger = logging.getLogger(__name__)

HELP = "Score predicted captions against references (BLEU-1..4, METEOR, ROUGE-L, CIDEr; SPICE on request)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pred", required=True, help="COCO-style results [{image_id, caption}] or {id: caption}")
    parser.add_argument(
        "--refs",
        default=None,
        help='JSON object from id to its reference captions, e.g. {"CLEVR_semantic_000001.png": ["the cube moved", '
        '"the small cube changed its position"]}; `procap evaluate` writes one as references.json (or give '
        "--dataset and --root)",
    )
    parser.add_argument(
        "--dataset", choices=sorted(DATASETS), default=None, help="take the references from this dataset's split"
    )
    parser.add_argument("--root", default=None, help="dataset root folder (with --dataset)")
    parser.add_argument("--split", default="test", choices=SPLITS, help="split used with --dataset (default test)")
    parser.add_argument("--types", default=None, help="optional {id: change type} for a per-type breakdown")
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=["bleu", "meteor", "rouge", "cider"],
        help=f"metrics to compute, {METRICS_SPELLING_HELP}; any BLEU brings all four orders (default: bleu meteor "
        "rouge cider; METEOR and SPICE need Java, SPICE also its CoreNLP jars)",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="score predictions that cover only some ids of the references (refused by default: the scores of a "
        "part are not those of the split); the report states the coverage either way",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="write the scores as JSON here (else one JSON line on stdout); both the table and the JSON give scores "
        "x100, as the papers do, under the names BLEU-1 ... CIDEr",
    )


def _references(args: argparse.Namespace) -> tuple[dict[str, list[str]], dict[str, str | None] | None, str]:
    """(id -> references, id -> change type or None, how messages name the source)."""
    from procap.eval.metrics import read_references

    if args.refs is not None:
        if args.dataset is not None or args.root is not None:
            raise ProCapError("give either --refs or --dataset with --root, not both.")
        return read_references(args.refs), None, f"reference file {args.refs}"
    if args.dataset is None or args.root is None:
        raise ProCapError("--refs is required, or --dataset and --root to take the references from a dataset split.")
    from procap.data import load_split

    pairs = load_split(args.dataset, args.root, args.split)
    types: dict[str, str | None] = {p.id: p.change_type for p in pairs if p.change_type is not None}
    return {p.id: list(p.captions) for p in pairs}, types or None, f"the {args.split} split of {args.root}"


def _check_ids(predictions: dict[str, str], references: dict[str, list[str]], pred: str, source: str) -> None:
    missing = [key for key in predictions if key not in references]
    if missing:
        raise ProCapError(f"{len(missing)} id(s) of prediction file {pred} are not in {source}, e.g. {missing[0]!r}.")
    empty = [key for key in predictions if not references[key]]
    if empty:
        raise ProCapError(f"id {empty[0]!r} of prediction file {pred} has no reference caption in {source}.")


def run(args: argparse.Namespace) -> int:
    from procap.core import validate
    from procap.core.files import atomic_write_json
    from procap.core.json_files import read_json
    from procap.eval.metrics import check_type_names, format_table, metric_names, paper_scale, read_predictions, score

    try:
        metrics = metric_names(args.metrics)
    except ProCapError as exc:
        raise ProCapError(f"--metrics {' '.join(args.metrics)!r}: {exc}") from None
    if not metrics:
        raise ProCapError(f"--metrics {' '.join(args.metrics)!r} names no metric.")
    if args.out:
        validate.output_file(args.out, "--out")
    predictions = read_predictions(args.pred)
    references, types, source = _references(args)
    if args.types:
        types = read_json(args.types, "change-type file")
        if not isinstance(types, dict) or not all(isinstance(v, str) for v in types.values()):
            raise ProCapError(f"change-type file {args.types} must be an object from id to change type.")
        try:
            check_type_names(types, predictions)
        except ProCapError as exc:
            raise ProCapError(f"change-type file {args.types}: {exc}") from None
    _check_ids(predictions, references, args.pred, source)
    # an id without a type was counted in the total and in no group of the breakdown, silently
    if args.types and types is not None:
        untyped = [key for key in predictions if key not in types]
        if untyped:
            raise ProCapError(
                f"change-type file {args.types} has no change type for id {untyped[0]!r} ({len(untyped)} of the "
                f"{len(predictions)} predicted ids); give every predicted id a type."
            )
    coverage = {"scored": len(predictions), "references": len(references), "source": source}
    if len(predictions) < len(references) and not args.allow_partial:
        raise ProCapError(
            f"prediction file {args.pred} covers {len(predictions)} of the {len(references)} ids of {source}, and "
            "scores of a part are not those of the whole; predict every id, or pass --allow-partial to score these."
        )
    results = {**paper_scale(score(predictions, references, metrics, types)), "coverage": coverage}
    if len(predictions) < len(references):
        logger.info("scored %d of the %d ids of %s (--allow-partial)", len(predictions), len(references), source)
    print(format_table(results))
    if args.out:
        atomic_write_json(args.out, results, indent=2)
    else:
        print(json.dumps({k: v for k, v in results.items() if k != "by_type"}))
    return 0
