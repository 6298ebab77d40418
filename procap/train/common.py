"""Pieces shared by the stage-1 and stage-2 entry points: data, vocabulary, model construction, captioning."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from procap.errors import ProCapError
from procap.train.config import TrainConfig
from procap.train.datasets import ImageCache


def load_pairs(cfg: TrainConfig, split: str) -> list:
    """``load_split(cfg.dataset, cfg.data, split)``, truncated to ``max_pairs`` for training when set."""
    from procap.data import load_split

    if cfg.data is None:
        raise ProCapError("--data is required: the dataset root folder")
    pairs = load_split(cfg.dataset, cfg.data, split)
    if not pairs:
        raise ProCapError(f"the {split} split of {cfg.data} is empty")
    if split == "train" and cfg.max_pairs:
        pairs = pairs[: cfg.max_pairs]
    return pairs


def build_vocab(pairs: Sequence[Any], dataset: str) -> Any:
    """The vocabulary of the pairs' captions with the dataset's ``min_count`` (:mod:`procap.data.datasets`)."""
    from procap.data import Vocabulary, get_dataset

    return Vocabulary.build([c for p in pairs for c in p.captions], min_count=get_dataset(dataset).min_count)


def new_model(preset: str, vocab: Any, vqgan_path: str | None, **overrides: Any) -> torch.nn.Module:
    """A freshly initialised ProCap for ``preset`` sized to ``vocab``, with trained VQGAN weights when given."""
    from procap.config import get_preset
    from procap.model.procap import ProCap
    from procap.train.vqgan_train import load_vqgan_into

    try:
        config = get_preset(preset, vocab_size=len(vocab), **overrides)
    except KeyError as exc:
        raise ProCapError(exc.args[0]) from None
    except ValueError as exc:  # e.g. --num-keyframes larger than the preset's generated frames
        raise ProCapError(f"preset {preset} with {overrides}: {exc}") from None
    model = ProCap(config)
    if vqgan_path:
        load_vqgan_into(model, vqgan_path)
    return model


@torch.no_grad()
def caption_pairs(
    model: torch.nn.Module,
    vocab: Any,
    pairs: Sequence[Any],
    batch_size: int = 32,
    cache: ImageCache | None = None,
    device: torch.device | str = "cpu",
    amp: bool = False,
    max_len: int | None = None,
    remember: bool = False,
    generate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[dict[str, str], dict[str, float]]:
    """Greedy captions for ``pairs`` (id -> text) and timing (``captions_per_s``, ``tokens_per_s``).

    Tokens are counted honestly, up to and including EOS. ``max_len`` caps the decoding length (default the
    model's). ``remember`` stores the images' features in a cached tokenizer (repeated validation). ``generate``
    replaces ``model.generate`` (``(before, after) -> tokens``: a ``procap.fast.Captioner``, beam search...).
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    cache = cache or ImageCache(model.config.image_size, enabled=False)
    model.eval()
    predictions: dict[str, str] = {}
    tokens, seconds = 0, 0.0
    eos = vocab.eos_id
    for start in tqdm(range(0, len(pairs), batch_size), desc="caption", leave=False, disable=len(pairs) <= batch_size):
        chunk = pairs[start : start + batch_size]
        before = torch.stack([cache(p.before_path) for p in chunk]).to(device)
        after = torch.stack([cache(p.after_path) for p in chunk]).to(device)
        if remember and hasattr(model.vqgan, "remember"):
            model.vqgan.remember(torch.cat([before, after]), codes=False)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp and device.type == "cuda"):
            ids = model.generate(before, after, max_len=max_len) if generate is None else generate(before, after)
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


def score_captions(
    predictions: dict[str, str],
    pairs: Sequence[Any],
    metrics: Sequence[str] = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr"),
    by_type: bool = False,
) -> dict[str, Any]:
    """Score ``predictions`` (id -> text) against the pairs' references with ``procap.evaluate.score``.

    Args:
        metrics: any spellings of BLEU-4, METEOR, ROUGE-L, CIDEr (``procap.evaluate.metric_name``).
        by_type: return ``{group: {metric: value}}`` for total / change / no_change / each change type
            (CLEVR-Change) instead of one ``{metric: value}``.

    Returns:
        Scores x100 (as in the papers) keyed by the table's names (``BLEU-4``, ``METEOR``, ``ROUGE-L``, ``CIDEr``).
    """
    from procap.evaluate import METRIC_TABLE, metric_names, score

    names = metric_names(metrics)

    def display(raw: dict[str, float]) -> dict[str, float]:
        return {m: 100.0 * float(raw[METRIC_TABLE[m][1]]) for m in names}

    references = {p.id: list(p.captions) for p in pairs}
    predictions = {p.id: predictions[p.id] for p in pairs}
    if not by_type:
        return display(score(predictions, references, metrics=names))
    result = score(predictions, references, metrics=names, change_types={p.id: p.change_type for p in pairs})
    groups = result.get("by_type", result)  # {group: {metric: value}}
    return {name: display(values) for name, values in groups.items() if isinstance(values, dict)}


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON at ``path``, atomically (:func:`procap.files.atomic_write_json`)."""
    from procap.files import atomic_write_json

    atomic_write_json(path, obj, indent=1)
