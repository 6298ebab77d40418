"""Pieces shared by the stage-1 and stage-2 entry points: data, vocabulary, model construction.

Captioning and scoring a split (``caption_pairs``, ``score_captions``) live in :mod:`procap.eval.split`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from procap.core.config import UNTRAINED_VQGAN, get_preset
from procap.core.errors import ProCapError
from procap.data import Vocabulary, get_dataset, load_split
from procap.data.domain import TRAINED_ON, training_domain
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from procap.train.vqgan_train import load_vqgan_into


def load_pairs(cfg: TrainConfig, split: str) -> list:
    """``load_split(cfg.dataset, cfg.data, split)``, truncated to ``max_pairs`` for training when set."""
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
    return Vocabulary.build([c for p in pairs for c in p.captions], min_count=get_dataset(dataset).min_count)


def new_model(preset: str, vocab: Vocabulary, vqgan_path: str | None, **overrides: Any) -> ProCap:
    """A freshly initialised ProCap for ``preset`` sized to ``vocab``, with trained VQGAN weights when given."""
    try:
        config = get_preset(preset, vocab_size=len(vocab), **overrides)
    except KeyError as exc:
        raise ProCapError(exc.args[0]) from None
    except ValueError as exc:  # e.g. --num-keyframes larger than the preset's generated frames
        raise ProCapError(f"preset {preset} with {overrides}: {exc}") from None
    model = ProCap(config)
    if vqgan_path and vqgan_path != UNTRAINED_VQGAN:
        load_vqgan_into(model, vqgan_path)
    return model


def with_domain(cfg: TrainConfig, pairs: Sequence[Any], model: ProCap) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What a stage adds to the ``extra`` metadata of every checkpoint it writes: the ``trained_on`` record of its
    training pairs (:mod:`procap.data.domain`), read once."""
    record = training_domain(cfg.dataset, pairs, model.config.image_size, model.config.name, cfg.data)
    return lambda extra: {**extra, TRAINED_ON: record}
