"""Stage 2, implicit procedure captioning: procedure queries + caption decoder, best checkpoint by validation.

``train(cfg)`` initialises from a stage-1 checkpoint (``cfg.init``) or, for the static-pair baseline, from
scratch (``k = 0`` and no stage 1), trains with teacher forcing, validates greedy captions on the validation
split, and keeps ``best.safetensors`` by ``cfg.select_metric``: CIDEr, or the captions' correctness. The test split
is never looked at.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from procap.core.errors import ProCapError
from procap.core.extras import require_all
from procap.data.images import ImageCache
from procap.eval.correctness import caption_accuracy, scene_truths
from procap.eval.split import caption_pairs, score_captions
from procap.loading.checkpoint import read_checkpoint_metadata, recorded_stage, save_checkpoint
from procap.model.decoder import PAD_ID
from procap.train import distributed
from procap.train.common import load_pairs, with_domain
from procap.train.config import TrainConfig, filled
from procap.train.datasets import PairDataset, identical_training_pairs
from procap.train.loop import LossFn, Trainer, ValidateFn
from procap.train.schedules import stage2_optimizer
from procap.train.stage1 import placed_model, weight_loader

if TYPE_CHECKING:
    from procap.data import Vocabulary
    from procap.model.procap import ProCap

logger = logging.getLogger(__name__)


def restart_front_end(cfg: TrainConfig, model: ProCap) -> list[str]:
    """Under ``departures.restart_front_end``, a run started from a stage-1 checkpoint (``cfg.init``) draws the
    encoder's front end anew from ``cfg.seed`` and keeps the rest (:meth:`ProCap.restart_front_end`); returns the
    names restarted, none for any other start (from scratch, or from a stage-2 checkpoint, whose front end already
    learned to caption)."""
    if not (cfg.init and model.departures.restart_front_end):
        return []
    if recorded_stage(read_checkpoint_metadata(cfg.init)) != "stage1":
        return []
    restarted = model.restart_front_end(cfg.seed)
    logger.info(
        "stage 2: the front end starts anew (%d tensors); the stack, positions and e_m are stage 1's", len(restarted)
    )
    return restarted


def validation_subset(pairs: Sequence[Any], limit: int | None, seed: int = 0) -> list:
    """At most ``limit`` pairs drawn uniformly (fixed seed) from the split, in split order.

    A random draw rather than a stride: CLEVR-Change alternates change and distractor pairs, so every
    second pair would be all changes.
    """
    pairs = list(pairs)
    if not limit or len(pairs) <= limit:
        return pairs
    keep = sorted(random.Random(seed).sample(range(len(pairs)), limit))
    return [pairs[i] for i in keep]


def decode_length(vocab: Vocabulary, pairs: Sequence[Any], limit: int) -> int:
    """Decoding length for validation: the longest training caption + 2 tokens of slack, at most ``limit``.

    Greedy decoding is causal, so any length that fits the generated caption and its EOS gives identical
    captions; capping it only saves decoder steps.
    """
    lengths = [sum(t != vocab.pad_id for t in vocab.encode(c, max_len=limit)) for p in pairs for c in p.captions]
    return min(limit, max(lengths) + 2)


def make_validator(
    cfg: TrainConfig,
    model: ProCap,
    vocab: Vocabulary,
    pairs: Sequence[Any],
    cache: ImageCache,
    max_len: int | None = None,
    truths: dict[str, Any] | None = None,
) -> ValidateFn:
    """``(step) -> metrics`` on the validation pairs with ``cfg.val_metrics`` (no METEOR by default: speed).

    Besides the caption metrics it reports ``distinct`` (distinct captions / validation pairs) and, with
    ``truths`` (:func:`procap.eval.correctness.scene_truths`), the correctness fractions ``acc_change``,
    ``acc_type``, ``acc_object`` and their mean, ``correctness`` (``--select correctness``). When the captions stop varying (at most two distinct captions over at least
    ten pairs) it warns: that is the signature of a collapsed memory, visible long before the scores say so.
    """

    def validate(step: int) -> dict[str, float]:
        predictions, _ = caption_pairs(
            model,
            vocab,
            pairs,
            batch_size=max(filled(cfg.batch_size, "batch_size"), 32),
            cache=cache,
            device=cfg.torch_device(),
            amp=cfg.amp,
            max_len=max_len,
            remember=cfg.cache_features,
            progress=cfg.progress,
        )
        metrics = validation_metrics(predictions, pairs, cfg.val_metrics, truths)
        _warn_if_collapsed(predictions, step)
        return metrics

    return validate


def validation_metrics(
    predictions: dict[str, str], pairs: Sequence[Any], names: Sequence[str], truths: dict[str, Any] | None
) -> dict[str, float]:
    """The caption metrics ``names``, ``distinct`` and, with ``truths``, the correctness fractions (as
    :func:`make_validator` says)."""
    scores = score_captions(predictions, pairs, names)
    metrics = {k: float(v) for k, v in scores.items() if isinstance(v, (int, float))}
    metrics["distinct"] = len(set(predictions.values())) / max(1, len(predictions))
    if truths:
        accuracy = caption_accuracy(predictions, truths)
        parts = {f"acc_{k}": value for k in ("change", "type", "object") if (value := accuracy[k]) is not None}
        metrics.update(parts)
        # a pair set without change pairs has no type or object figure: the mean of those it has
        metrics["correctness"] = sum(parts.values()) / len(parts) if parts else 0.0
    return metrics


def _warn_if_collapsed(predictions: dict[str, str], step: int) -> None:
    """Warn when the captions stop varying: at most two distinct over at least ten pairs."""
    distinct = len(set(predictions.values()))
    if len(predictions) >= 10 and distinct <= 2:
        warnings.warn(
            f"stage 2, step {step}: the captions stopped varying ({distinct} distinct over "
            f"{len(predictions)} validation pairs); the decoder memory may have collapsed "
            "(see memory_std in log.jsonl)",
            stacklevel=3,
        )


def caption_targets(batch: dict[str, Any]) -> torch.Tensor:
    """Number of non-PAD next-token targets in a batch: ``caption_loss`` averages over these, so micro-batches
    and ranks are weighted by it (:class:`~procap.train.loop.Trainer` ``weight_fn``)."""
    return (batch["caption"][:, 1:] != PAD_ID).sum()


def _validation_set(
    cfg: TrainConfig, val_pairs: Sequence[Any] | None, truths: dict[str, Any] | None
) -> tuple[list[Any], dict[str, Any] | None]:
    """The validation pairs (at most ``cfg.val_pairs``) and their truths, read from CLEVR-Change's scenes when not
    given; ``--select correctness`` without truths is refused."""
    val_pairs = validation_subset(val_pairs if val_pairs is not None else load_pairs(cfg, "val"), cfg.val_pairs)
    if truths is None and cfg.dataset == "clevr-change" and cfg.data is not None:
        truths = scene_truths(cfg.data, val_pairs)
    if cfg.select_metric == "correctness" and not truths:
        raise ProCapError(
            f"--select correctness needs each validation pair's truth, which {cfg.dataset} does not have here; "
            "select by CIDEr instead."
        )
    return val_pairs, truths


def _stage2_loss(cfg: TrainConfig, model: ProCap) -> LossFn:
    """The teacher-forced caption loss; with ``--cache-features`` the frozen VQGAN's output is memoised per image."""
    if cfg.cache_features:
        model.vqgan.memoize()

    def loss_fn(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        if cfg.cache_features:
            model.vqgan.remember(torch.cat([batch["before"], batch["after"]]), codes=False)
        return model.stage2_loss(batch["before"], batch["after"], batch["caption"])

    return loss_fn


def train(
    cfg: TrainConfig,
    pairs: Sequence[Any] | None = None,
    val_pairs: Sequence[Any] | None = None,
    vocab: Vocabulary | None = None,
    cache: ImageCache | None = None,
    truths: dict[str, Any] | None = None,
) -> Path:
    """Run stage 2 and return the best checkpoint by ``cfg.select_metric`` on validation (``<out>/best.safetensors``).

    Args:
        cfg: training options (``stage="train"``); ``cfg.init`` is the stage-1 checkpoint, or ``None`` to start
            from scratch (static-pair baseline with ``num_keyframes=0``).
        pairs, val_pairs: training and validation pairs (default: the ``train`` / ``val`` splits of ``cfg.data``).
        vocab: vocabulary when starting from scratch (ignored with ``init``: the checkpoint's is used).
        cache: shared in-memory image cache.
        truths: ground truth per pair id for validation correctness (default: read from ``cfg.data`` on
            CLEVR-Change, see :func:`procap.eval.correctness.scene_truths`).
    """
    cfg = distributed.resume_after_restart(cfg.resolved())
    require_all(cfg.optional_packages(), "procap train")  # before any work, not at the first use
    torch.manual_seed(cfg.seed)
    pairs = list(pairs) if pairs is not None else load_pairs(cfg, "train")
    pairs += identical_training_pairs(pairs, cfg.identical_pairs, cfg.seed)
    val_pairs, truths = _validation_set(cfg, val_pairs, truths)
    model, vocab, _ = placed_model(cfg, pairs, vocab)
    restart_front_end(cfg, model)
    model.trained_stage = "stage2"  # a stage-1 init's record no longer holds: this run trains the decoder
    config = model.config
    facts = with_domain(cfg, pairs, model)
    cache = cache if cache is not None else ImageCache(config.image_size, cfg.cache_images)
    dataset = PairDataset(pairs, vocab, config.image_size, config.max_caption_len, cfg.seed, cache)
    max_len = decode_length(vocab, pairs, config.max_caption_len)
    trainer = Trainer(
        cfg,
        model,
        dataset,
        _stage2_loss(cfg, model),
        lambda total: stage2_optimizer(model, cfg, total),
        save_weights=lambda path, extra: save_checkpoint(path, model, vocab, facts(extra)),
        load_weights=weight_loader(model),
        validate=make_validator(cfg, model, vocab, val_pairs, cache, max_len, truths),
        metric=cfg.select_metric,
        name="stage2",
        weight_fn=caption_targets,
    )
    trainer.fit()
    return trainer.best_path if trainer.best_path.exists() else trainer.last_path
