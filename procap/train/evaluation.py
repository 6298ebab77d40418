"""Evaluate a checkpoint on a split: captions, COCO-style result file, metrics (per change type on CLEVR-Change)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from procap.train.common import caption_pairs, score_captions, write_json
from procap.train.datasets import ImageCache

ALL_METRICS = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr")


def java_available() -> bool:
    """METEOR (pycocoevalcap) runs a Java program; without ``java`` on PATH it cannot be computed."""
    return shutil.which("java") is not None


def default_metrics() -> tuple[tuple[str, ...], str | None]:
    """All four metrics, or all but METEOR with a note saying why when Java is missing."""
    if java_available():
        return ALL_METRICS, None
    note = "METEOR skipped: it needs Java (install a JRE, e.g. `apt-get install default-jre-headless`)"
    return tuple(m for m in ALL_METRICS if m != "METEOR"), note


def breakdown(predictions: dict[str, str], pairs: Sequence[Any], metrics: Sequence[str]) -> dict[str, dict]:
    """CLEVR-Change style scores: ``total``, ``change`` (all semantic changes), ``no_change``, and each type.

    Groups follow the change-captioning papers' protocol: each group is scored on its own pairs.
    """
    groups: dict[str, list] = {"total": list(pairs)}
    for pair in pairs:
        kind = pair.change_type
        if kind is None:
            continue
        groups.setdefault("no_change" if kind == "no_change" else "change", []).append(pair)
        if kind != "no_change":
            groups.setdefault(kind, []).append(pair)
    return {name: {**score_captions(predictions, members, metrics), "pairs": len(members)}
            for name, members in groups.items()}


def evaluate_model(model: torch.nn.Module, vocab: Any, pairs: Sequence[Any], metrics: Sequence[str] | None = None,
                   batch_size: int = 32, device: torch.device | str = "cpu", cache: ImageCache | None = None,
                   out: Path | str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Caption ``pairs`` greedily and score them; writes ``results.json`` and ``metrics.json`` under ``out``.

    Returns:
        ``{"metrics": {...}, "by_type": {...} (when pairs carry change types), "speed": {...}, "note": ...}``
        plus the predictions under ``"predictions"`` (id -> caption).
    """
    note = None
    if metrics is None:
        metrics, note = default_metrics()
    predictions, speed = caption_pairs(model, vocab, pairs, batch_size=batch_size, cache=cache, device=device)
    report: dict[str, Any] = {**(extra or {}), "pairs": len(pairs), "metrics": score_captions(predictions, pairs,
                                                                                              metrics)}
    if any(p.change_type is not None for p in pairs):
        report["by_type"] = breakdown(predictions, pairs, metrics)
    report["speed"] = speed
    if note:
        report["note"] = note
    if out is not None:
        out = Path(out)
        write_json(out / "results.json", [{"image_id": k, "caption": v} for k, v in predictions.items()])
        write_json(out / "metrics.json", report)
    report["predictions"] = predictions
    return report
