"""Evaluate a checkpoint on a split: captions, COCO-style result file, metrics (per change type on CLEVR-Change)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from procap.core.files import atomic_write_json, commit_unit
from procap.data.images import ImageCache
from procap.data.records import ChangePair
from procap.eval.correctness import caption_accuracy
from procap.eval.metrics import (
    EVALUATION_FILES,
    METRIC_TABLE,
    METRICS,
    SCORE_SCALE,
    available_metrics,
    metric_names,
    score,
    write_results,
)

if TYPE_CHECKING:
    from procap.data import Vocabulary
    from procap.model.decoding import DecodingStrategy
    from procap.model.procap import ProCap

ALL_METRICS = METRICS  # the names of procap.eval.metrics.METRIC_TABLE


@torch.no_grad()
def caption_pairs(
    model: ProCap,
    vocab: Vocabulary,
    pairs: Sequence[Any],
    batch_size: int = 32,
    cache: ImageCache | None = None,
    device: torch.device | str = "cpu",
    amp: bool = False,
    max_len: int | None = None,
    remember: bool = False,
    generate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    progress: bool = True,
    strategy: str | DecodingStrategy | None = None,
) -> tuple[dict[str, str], dict[str, float]]:
    """Captions for ``pairs`` (id -> text) and timing (``captions_per_s``, ``tokens_per_s``).

    Tokens are counted honestly, up to and including EOS. ``max_len`` caps the decoding length (default the
    model's). ``remember`` stores the images' features in a cached tokenizer (repeated validation). ``strategy``
    is how ``model.generate`` decodes (a :mod:`procap.model.decoding` strategy or its name; default greedy);
    ``generate`` replaces ``model.generate`` (``(before, after) -> tokens``: a ``procap.fast.Captioner``, which
    holds its own strategy). ``progress`` shows a bar over the batches (never for a single batch).
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    cache = cache or ImageCache(model.config.image_size, enabled=False)
    model.eval()
    predictions: dict[str, str] = {}
    tokens, seconds = 0, 0.0
    eos = vocab.eos_id
    batches = range(0, len(pairs), batch_size)
    for start in tqdm(batches, desc="caption", leave=False, disable=not progress or len(pairs) <= batch_size):
        chunk = pairs[start : start + batch_size]
        before = torch.stack([cache(p.before_path) for p in chunk]).to(device)
        after = torch.stack([cache(p.after_path) for p in chunk]).to(device)
        if remember and hasattr(model.vqgan, "remember"):
            model.vqgan.remember(torch.cat([before, after]), codes=False)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp and device.type == "cuda"):
            if generate is None:
                ids = model.generate(before, after, max_len=max_len, strategy=strategy)
            else:
                ids = generate(before, after)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        ids = ids.cpu()
        for pair, row in zip(chunk, ids):
            predictions[pair.id] = model.caption_text(vocab, row.tolist())
            hit = (row == eos).nonzero()
            tokens += int(hit[0, 0]) + 1 if hit.numel() else row.numel()
    rates = {
        "captions_per_s": len(pairs) / max(seconds, 1e-9),
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "seconds": seconds,
    }
    return predictions, rates


def identical_pairs(pairs: Sequence[Any]) -> list[ChangePair]:
    """Every distinct image of ``pairs`` (befores and afters) as a pair of itself, before = after: whatever the
    dataset, the one true caption of such a pair is that nothing changed. Ids are the images' paths."""
    images = dict.fromkeys(str(path) for pair in pairs for path in (pair.before_path, pair.after_path))
    return [ChangePair(path, Path(path), Path(path), [], "no_change") for path in images]


def identical_pair_rate(model: ProCap, vocab: Vocabulary, pairs: Sequence[Any], **caption_options: Any) -> dict:
    """How often ``model`` says that nothing changed when shown the same image twice, over every image of ``pairs``
    (:func:`identical_pairs`, captioned by :func:`caption_pairs` with ``caption_options``).

    Returns:
        ``pairs`` (images tried), ``no_change`` (captions that claim no change, by
        :func:`procap.eval.correctness.parse_caption`), ``rate`` (their share, None without images) and
        ``examples``: up to 5 images captioned with a change, with their captions.
    """
    from procap.eval.correctness import parse_caption

    identical = identical_pairs(pairs)
    captions, _ = caption_pairs(model, vocab, identical, **caption_options)
    said = [parse_caption(captions[pair.id]).claims_no_change for pair in identical]
    examples = [{"image": pair.id, "caption": captions[pair.id]} for pair, ok in zip(identical, said) if not ok]
    return {
        "pairs": len(identical),
        "no_change": sum(said),
        "rate": sum(said) / len(identical) if identical else None,
        "examples": examples[:5],
    }


def score_captions(
    predictions: dict[str, str],
    pairs: Sequence[Any],
    metrics: Sequence[str] = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr"),
    by_type: bool = False,
) -> dict[str, Any]:
    """Score ``predictions`` (id -> text) against the pairs' references with ``procap.eval.metrics.score``.

    Args:
        metrics: any spellings of the names of ``procap.eval.metrics.METRIC_TABLE`` (BLEU-1..4, METEOR, ROUGE-L,
            CIDEr, SPICE; ``procap.eval.metrics.metric_name``).
        by_type: return ``{group: {metric: value}}`` for total / change / no_change / each change type
            (CLEVR-Change) instead of one ``{metric: value}``.

    Returns:
        Scores x100 (as in the papers) keyed by the table's names (``BLEU-1`` ... ``CIDEr``, ``SPICE``).
    """
    names = metric_names(metrics)

    def display(raw: dict[str, float]) -> dict[str, float]:
        return {m: SCORE_SCALE * float(raw[METRIC_TABLE[m][1]]) for m in names}

    references = {p.id: list(p.captions) for p in pairs}
    predictions = {p.id: predictions[p.id] for p in pairs}
    if not by_type:
        return display(score(predictions, references, metrics=names))
    result = score(predictions, references, metrics=names, change_types={p.id: p.change_type for p in pairs})
    groups = result.get("by_type", result)  # {group: {metric: value}}
    return {name: display(values) for name, values in groups.items() if isinstance(values, dict)}


def default_metrics(wanted: Sequence[str] = ALL_METRICS) -> tuple[tuple[str, ...], str | None]:
    """The metrics of ``wanted`` (all by default) this machine can compute, and a one-line note naming those it
    skips and why (METEOR and SPICE need Java; SPICE also its CoreNLP jars): ``procap.eval.metrics.available_metrics``.
    """
    return available_metrics(wanted)


def breakdown(predictions: dict[str, str], pairs: Sequence[Any], metrics: Sequence[str]) -> dict[str, dict]:
    """CLEVR-Change style scores: ``total``, ``change`` (all semantic changes), ``no_change`` and each type (LEVIR-CC:
    ``total``, ``change``, ``no_change`` from its ``changeflag``).

    Each group is scored on its own pairs (CIDEr's document frequencies come from the group), as in the
    change-captioning papers; every group also records its number of pairs.
    """
    counts: dict[str, int] = {"total": len(pairs)}
    for pair in pairs:
        if pair.change_type not in ("change", "no_change"):  # a named type; LEVIR-CC's pairs are only the two
            counts[pair.change_type] = counts.get(pair.change_type, 0) + 1
        group = "no_change" if pair.change_type == "no_change" else "change"
        counts[group] = counts.get(group, 0) + 1
    groups = score_captions(predictions, pairs, metrics, by_type=True)
    return {name: {**values, "pairs": counts.get(name, 0)} for name, values in groups.items()}


def write_evaluation(
    out: Path, predictions: dict[str, str], report: dict[str, Any], pairs: Sequence[Any] | None = None
) -> None:
    """Write ``results.json``, ``metrics.json`` and, given ``pairs``, their ``references.json`` under ``out`` as one
    unit (:func:`procap.core.files.commit_unit`): a full disk at the second file left new predictions beside the old
    scores, and a kill between them does no longer either. ``metrics.json``, which scores the others, goes last."""

    def write(staging: Path) -> None:
        write_results(staging / "results.json", predictions)
        if pairs is not None:
            # what `procap score --pred results.json --refs references.json` reads
            atomic_write_json(staging / "references.json", {pair.id: list(pair.captions) for pair in pairs}, indent=1)
        atomic_write_json(staging / "metrics.json", report, indent=1)

    commit_unit(out / "metrics.json", EVALUATION_FILES, write)


def evaluate_model(
    model: ProCap,
    vocab: Vocabulary,
    pairs: Sequence[Any],
    metrics: Sequence[str] | None = None,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    cache: ImageCache | None = None,
    out: Path | str | None = None,
    extra: dict[str, Any] | None = None,
    truths: dict[str, Any] | None = None,
    generate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    progress: bool = True,
    references: bool = False,
    strategy: str | DecodingStrategy | None = None,
) -> dict[str, Any]:
    """Caption ``pairs`` (with ``model.generate`` under ``strategy``, greedy by default, or with ``generate``) and
    score them; writes ``results.json`` and ``metrics.json`` under ``out`` (:func:`write_evaluation`).

    Args:
        references: also write the pairs' reference captions to ``references.json`` under ``out``.
        generate: ``(before, after) -> tokens`` replacing ``model.generate`` (the fast path, an ablation).
        strategy: how ``model.generate`` decodes (:func:`caption_pairs`).
        progress: a bar over the captioning batches (:func:`caption_pairs`).
        truths: optional ground truth per pair id (:func:`procap.eval.correctness.scene_truths`); when given, the
            report adds ``"accuracy"`` (change / type / object / new value / distinct, see
            :func:`procap.eval.correctness.caption_accuracy`).

    Returns:
        ``{"metrics": {...}, "by_type": {...} (when pairs carry change types), "accuracy": {...} (with
        ``truths``), "speed": {...}, "note": ...}`` plus the predictions under ``"predictions"`` (id -> caption).
    """
    note = None
    if metrics is None:
        metrics, note = default_metrics()
    predictions, speed = caption_pairs(
        model,
        vocab,
        pairs,
        batch_size=batch_size,
        cache=cache,
        device=device,
        generate=generate,
        progress=progress,
        strategy=strategy,
    )
    report: dict[str, Any] = {**(extra or {}), "pairs": len(pairs)}
    if all(p.change_type is not None for p in pairs):
        # One scoring call for every group: each call starts Java (PTB tokenizer, METEOR).
        report["by_type"] = breakdown(predictions, pairs, metrics)
        report["metrics"] = {m: report["by_type"]["total"][m] for m in metrics}
    else:
        report["metrics"] = score_captions(predictions, pairs, metrics)
    if truths:
        report["accuracy"] = caption_accuracy(predictions, truths)
    report["speed"] = speed
    if note:
        report["note"] = note
    if out is not None:
        write_evaluation(Path(out), predictions, report, pairs if references else None)
    report["predictions"] = predictions
    return report
