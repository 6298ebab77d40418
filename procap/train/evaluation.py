"""Evaluate a checkpoint on a split: captions, COCO-style result file, metrics (per change type on CLEVR-Change)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from procap.evaluate import METRICS
from procap.train.common import caption_pairs, score_captions, write_json
from procap.train.datasets import ImageCache

ALL_METRICS = METRICS  # the names of procap.evaluate.METRIC_TABLE


def default_metrics() -> tuple[tuple[str, ...], str | None]:
    """All four metrics, or all but METEOR with a note saying why when Java is missing."""
    from procap.evaluate import java_available

    if java_available():
        return ALL_METRICS, None
    note = "METEOR skipped: it needs Java (install a JRE, e.g. `apt-get install default-jre-headless`)"
    return tuple(m for m in ALL_METRICS if m != "METEOR"), note


def breakdown(predictions: dict[str, str], pairs: Sequence[Any], metrics: Sequence[str]) -> dict[str, dict]:
    """CLEVR-Change style scores: ``total``, ``change`` (all semantic changes), ``no_change`` and each type.

    Each group is scored on its own pairs (CIDEr's document frequencies come from the group), as in the
    change-captioning papers; every group also records its number of pairs.
    """
    counts: dict[str, int] = {"total": len(pairs)}
    for pair in pairs:
        counts[pair.change_type] = counts.get(pair.change_type, 0) + 1
        if pair.change_type != "no_change":
            counts["change"] = counts.get("change", 0) + 1
    groups = score_captions(predictions, pairs, metrics, by_type=True)
    return {name: {**values, "pairs": counts.get(name, 0)} for name, values in groups.items()}


def evaluate_model(
    model: torch.nn.Module,
    vocab: Any,
    pairs: Sequence[Any],
    metrics: Sequence[str] | None = None,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    cache: ImageCache | None = None,
    out: Path | str | None = None,
    extra: dict[str, Any] | None = None,
    truths: dict[str, Any] | None = None,
    generate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Caption ``pairs`` (greedily with ``model.generate``, or with ``generate``) and score them; writes
    ``results.json`` and ``metrics.json`` under ``out``.

    Args:
        generate: ``(before, after) -> tokens`` replacing ``model.generate`` (the fast path, beam search).
        truths: optional ground truth per pair id (:func:`procap.correctness.scene_truths`); when given, the
            report adds ``"accuracy"`` (change / type / object / new value / distinct, see
            :func:`procap.correctness.caption_accuracy`).

    Returns:
        ``{"metrics": {...}, "by_type": {...} (when pairs carry change types), "accuracy": {...} (with
        ``truths``), "speed": {...}, "note": ...}`` plus the predictions under ``"predictions"`` (id -> caption).
    """
    note = None
    if metrics is None:
        metrics, note = default_metrics()
    predictions, speed = caption_pairs(
        model, vocab, pairs, batch_size=batch_size, cache=cache, device=device, generate=generate
    )
    report: dict[str, Any] = {**(extra or {}), "pairs": len(pairs)}
    if all(p.change_type is not None for p in pairs):
        # One scoring call for every group: each call starts Java (PTB tokenizer, METEOR).
        report["by_type"] = breakdown(predictions, pairs, metrics)
        report["metrics"] = {m: report["by_type"]["total"][m] for m in metrics}
    else:
        report["metrics"] = score_captions(predictions, pairs, metrics)
    if truths:
        from procap.correctness import caption_accuracy

        report["accuracy"] = caption_accuracy(predictions, truths)
    report["speed"] = speed
    if note:
        report["note"] = note
    if out is not None:
        out = Path(out)
        from procap.evaluate import write_results

        write_results(out / "results.json", predictions)
        write_json(out / "metrics.json", report)
    report["predictions"] = predictions
    return report
