"""`procap evaluate`: caption a split with a checkpoint and score it (COCO result file + metrics.json)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procap.commands.hub_args import CHECKPOINT_HELP, add_hub_arguments, checkpoint_file, local_checkpoint
from procap.core.config import ABLATABLE_PARTS
from procap.eval.metrics import EVALUATION_FILES, METRICS_SPELLING_HELP

if TYPE_CHECKING:  # annotations only: the command's module stays torch-free (procap --help)
    import torch

    from procap.data.records import ChangePair
    from procap.data.vocab import Vocabulary
    from procap.model.decoding import DecodingStrategy
    from procap.model.procap import ProCap

logger = logging.getLogger(__name__)

HELP = (
    "Evaluate a checkpoint on a split: BLEU-1..4/METEOR/ROUGE-L/CIDEr/SPICE "
    "(per change type on CLEVR-Change, change / no change on LEVIR-CC)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from procap.commands.caption import add_decoding_arguments

    _add_data_arguments(parser)
    _add_output_arguments(parser)
    _add_captioning_arguments(parser)
    add_decoding_arguments(parser)
    add_hub_arguments(parser)


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The "checkpoint and data" group: what is evaluated, on which pairs."""
    from procap.data.datasets import DATASETS, DEFAULT_DATASET, SPLITS

    group = parser.add_argument_group("checkpoint and data")
    group.add_argument("--ckpt", required=True, help=CHECKPOINT_HELP)
    group.add_argument("--data", required=True, help="dataset root folder")
    group.add_argument(
        "--dataset",
        choices=sorted(DATASETS),
        default=DEFAULT_DATASET,
        help=f"dataset format (default {DEFAULT_DATASET})",
    )
    group.add_argument("--split", default="test", choices=SPLITS, help="split (default test)")
    group.add_argument("--max-pairs", type=int, help="evaluate only the first N pairs (N >= 1)")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The "scores and output" group: which metrics, where the files go."""
    group = parser.add_argument_group("scores and output")
    group.add_argument(
        "--metrics",
        nargs="+",
        help=f"metrics to compute, {METRICS_SPELLING_HELP} (default: all; METEOR and SPICE are skipped with a "
        "one-line note when Java, or SPICE's CoreNLP jars, are missing); scores are x100 in the table and "
        "metrics.json",
    )
    group.add_argument(
        "--out",
        help=f"folder for {', '.join(EVALUATION_FILES)} (default: eval_SPLIT beside the checkpoint, in the current "
        "folder for an hf:// one); one that holds them already is refused without --overwrite",
    )
    group.add_argument("--overwrite", action="store_true", help="replace the evaluation already in --out")
    group.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="show a progress bar on stderr when there is more than one batch (default on)",
    )


def _add_captioning_arguments(parser: argparse.ArgumentParser) -> None:
    """The "captioning" group: batch, device, the oracle or the fast path, and ablations."""
    group = parser.add_argument_group("captioning")
    group.add_argument("--batch-size", type=int, default=32, help="captions per batch (default 32)")
    group.add_argument("--device", default="auto", help="cpu, cuda ... (default: cuda when available)")
    path = group.add_mutually_exclusive_group()
    path.add_argument(
        "--exact",
        dest="fast",
        action="store_false",
        help="the eager fp32 oracle, ProCap.generate (the default: scores comparable with published ones)",
    )
    path.add_argument(
        "--fast",
        dest="fast",
        action="store_true",
        help="procap.fast.Captioner: static KV cache, bf16 and CUDA graphs on a GPU (fp32 on the CPU, where its "
        "captions equal the oracle's)",
    )
    parser.set_defaults(fast=False)
    group.add_argument(
        "--ablate",
        nargs="+",
        choices=ABLATABLE_PARTS,
        help="inference-time ablation with the oracle: hide these parts of the decoder memory (the procedure "
        "queries' outputs, the pooled change token's slot, its window's cells) from the decoder",
    )


def run(args: argparse.Namespace) -> int:
    from procap.commands.caption import strategy_from_args
    from procap.core import validate
    from procap.core.errors import ProCapError

    # Every check that needs no torch (flags, a local --ckpt, --out, the split's pairs) comes before the device's,
    # which imports it: a wrong argument is one sentence in the first second (docs/errors.md).
    metrics = _checked_metrics(args)
    validate.number(args.batch_size, "--batch-size", minimum=1)
    validate.number(args.max_pairs, "--max-pairs", minimum=1)
    strategy = strategy_from_args(args)
    if args.ablate and (args.fast or strategy.name != "greedy"):
        raise ProCapError(
            "--ablate runs with the oracle's greedy decoding: leave out --fast and --beams or --strategy."
        )
    local = local_checkpoint(args)
    # Next to a local checkpoint; a Hub checkpoint lives in the download cache, so its results go to the cwd.
    beside = Path() if local is None else local.parent
    out = validate.fresh_output_dir(
        args.out or beside / f"eval_{args.split}", EVALUATION_FILES, "--out", args.overwrite, "an evaluation"
    )
    split_pairs, pairs = _pairs_to_evaluate(args)
    device = validate.device(args.device)
    checkpoint = checkpoint_file(args)
    from procap.loading.checkpoint import check_can_caption, load_checkpoint
    from procap.train.batch_memory import check_checkpoint_batch

    what = f"{args.split} pairs"
    args.batch_size = check_checkpoint_batch(checkpoint, args.batch_size, len(pairs), device, what, "evaluate")
    model, vocab, metadata = load_checkpoint(checkpoint, map_location=device)
    check_can_caption(metadata, args.ckpt)
    report = _evaluate(args, model, vocab, pairs, split_pairs, metrics, device, out, strategy, metadata)
    print(format_report(report))
    print(f"wrote {out / 'results.json'}, {out / 'metrics.json'} and {out / 'references.json'}")
    return 0


def _evaluate(
    args: argparse.Namespace,
    model: ProCap,
    vocab: Vocabulary,
    pairs: list[ChangePair],
    split_pairs: list[ChangePair],
    metrics: list[str] | None,
    device: torch.device,
    out: Path,
    strategy: DecodingStrategy,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """Caption and score ``pairs`` with the loaded model, writing the evaluation under ``out``; the report."""
    from procap.eval.split import evaluate_model

    truths = None
    if args.dataset == "clevr-change":
        from procap.eval.correctness import scene_truths

        truths = scene_truths(args.data, pairs)  # object / new value only where a synthetic scenes.json exists
    generate = _generator(args, model, vocab, device, strategy)
    return evaluate_model(
        model,
        vocab,
        pairs,
        metrics,
        args.batch_size,
        device,
        out=out,
        extra=_recorded_facts(args, split_pairs, strategy, metadata),
        truths=truths,
        generate=generate,
        strategy=strategy,
        references=True,
        progress=args.progress,
    )


def _recorded_facts(
    args: argparse.Namespace, split_pairs: list[ChangePair], strategy: DecodingStrategy, metadata: dict[str, Any]
) -> dict[str, Any]:
    """What ``metrics.json`` records beside the scores: the checkpoint, the split and how the captions were made."""
    from procap.model.decoding import strategy_record

    checkpoint_facts = metadata.get("extra") or {}
    return {
        "checkpoint": str(args.ckpt),
        # which weights were scored: a run's best.safetensors is the step validation picked, not the last one
        "checkpoint_step": checkpoint_facts.get("step"),
        "checkpoint_stage": checkpoint_facts.get("stage"),
        "dataset": args.dataset,
        "split": args.split,
        "split_pairs": len(split_pairs),  # with "pairs": the part of the split the scores cover
        "decoding": {"path": "fast" if args.fast else "exact", **strategy_record(strategy)},
        "ablated": list(args.ablate or []),
    }


def _checked_metrics(args: argparse.Namespace) -> list[str] | None:
    """The metrics ``--metrics`` names (None: the default set), refused now if this machine cannot compute one."""
    from procap.core.errors import ProCapError
    from procap.eval.metrics import metric_names, unavailable_metrics

    try:
        metrics = metric_names(args.metrics) if args.metrics else None
    except ProCapError as exc:
        raise ProCapError(f"--metrics {' '.join(args.metrics)!r}: {exc}") from None
    if args.metrics and not metrics:
        raise ProCapError(f"--metrics {' '.join(args.metrics)!r} names no metric.")
    if metrics:  # asked for by name: one the machine cannot compute fails now, not after captioning the split
        for name, why in unavailable_metrics(metrics).items():
            raise ProCapError(f"--metrics: {name} cannot run here: {why}.")
    return metrics


def _pairs_to_evaluate(args: argparse.Namespace) -> tuple[list, list]:
    """The split's pairs and the first ``--max-pairs`` of them, the ones evaluated (never none)."""
    from procap.core.errors import ProCapError
    from procap.data import load_split

    split_pairs = load_split(args.dataset, args.data, args.split)
    pairs = split_pairs[: args.max_pairs] if args.max_pairs else split_pairs
    if len(pairs) < len(split_pairs):  # the report says it covers part of the split, as this line does
        logger.info("evaluating %d of the %d %s pairs (--max-pairs)", len(pairs), len(split_pairs), args.split)
    if not pairs:
        raise ProCapError(f"the {args.split} split of {args.data} is empty")
    return split_pairs, pairs


def _generator(args: argparse.Namespace, model, vocab, device, strategy):
    """``(before, after) -> tokens`` of the chosen path: None for the oracle ``model.generate`` under ``strategy``
    (:func:`procap.eval.split.caption_pairs` calls it), the oracle on a memory missing the parts ``--ablate`` names,
    or a Captioner over ``model``."""
    import torch

    from procap.core.errors import ProCapError

    if args.ablate:
        parts = tuple(args.ablate)
        if "change" in parts and not model.departures.change_token:
            raise ProCapError("--ablate change: this checkpoint's model has no change token.")
        if "window" in parts and not model.departures.change_window:
            raise ProCapError("--ablate window: this checkpoint's model has no change window.")
        if "queries" in parts and model.config.num_keyframes == 0:
            raise ProCapError("--ablate queries: this checkpoint's model has no procedure queries (k = 0).")

        def ablated(before, after):
            model.eval()
            with torch.no_grad():
                return model.generate_from_memory(model.without_parts(model.memory(before, after), parts))

        return ablated
    if not args.fast:
        return None
    from procap.fast import Captioner

    captioner = Captioner(
        model,
        vocab,
        device=device,
        max_len=None,  # the oracle's length: the model's max_caption_len
        batch_sizes=(args.batch_size,),
        copy_model=False,
        strategy=strategy,
    )
    return captioner.generate


def format_report(report: dict) -> str:
    """A small text table: one row per group (total first), one column per metric."""
    rows = report.get("by_type") or {"total": {**report["metrics"], "pairs": report["pairs"]}}
    names = [m for m in report["metrics"]]
    lines = [f"{'group':<10} {'pairs':>6} " + " ".join(f"{n:>8}" for n in names)]
    for group, values in rows.items():
        lines.append(
            f"{group:<10} {values['pairs']:>6} " + " ".join(f"{values.get(n, float('nan')):8.2f}" for n in names)
        )
    if report.get("accuracy"):
        lines.append(format_accuracy(report["accuracy"]))
    speed = report["speed"]
    lines.append(f"{speed['captions_per_s']:.1f} captions/s, {speed['tokens_per_s']:.0f} tokens/s (up to EOS)")
    if report.get("note"):
        lines.append(report["note"])
    return "\n".join(lines)


def format_accuracy(accuracy: dict) -> str:
    """Caption correctness in two lines: change detection, type, object, new value, distinct captions; then the
    failure kinds (misses, false alarms, unparsed captions, moves called an add or a drop)."""

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    return (
        f"correctness: change {pct(accuracy['change'])}, type {pct(accuracy['type'])}, "
        f"object {pct(accuracy['object'])}, new value {pct(accuracy['new_value'])}, "
        f"distinct {pct(accuracy['distinct'])} ({accuracy['pairs']} pairs, {accuracy['change_pairs']} changes, "
        f"{accuracy['unparsed']} unparsed)"
        + "; object attributes: "
        + ", ".join(f"{name} {pct(value)}" for name, value in accuracy.get("attributes", {}).items())
        + f"\nfailures: missed {pct(accuracy['miss_rate'])} of the changes, "
        f"false alarm on {pct(accuracy['false_positive_rate'])} of the distractors, "
        f"{accuracy['unparsed_changes']} change and {accuracy['unparsed_distractors']} distractor captions unparsed "
        f"(counted wrong), moves called an add or a drop {pct(accuracy['move_as_add_drop'])}"
    )
