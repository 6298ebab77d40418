"""The ProCap checkpoint file, without pickle: model weights, config and vocabulary in one safetensors file.

A model checkpoint is one ``.safetensors`` file. Its header metadata (string -> string) carries everything
needed to rebuild the model: the :class:`~procap.core.config.ProCapConfig` as JSON, the vocabulary as a JSON
word -> index map, the names of tied (shared) tensors, and free-form ``extra`` JSON (step, metrics, and ``trained_on``: the data the
model was trained on, :mod:`procap.data.domain`; a checkpoint without it loads as one of unknown domain).
Loading reads tensors and JSON only, so opening an untrusted checkpoint runs no code.

Saving is handed the model and loading the class to build (:func:`read_checkpoint`), so nothing here names
``ProCap``: the model's own ``from_pretrained`` reads this file without reaching up a level.
:mod:`procap.loading.checkpoint` is the same format with ``ProCap`` named, for the library's callers. The file I/O under it
(atomic writes, tied tensors, shape / kind / finiteness checks) is :mod:`procap.core.weights`; the resumable training
state beside a checkpoint is :mod:`procap.train.state`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from procap.core import validate
from procap.core.config import ProCapConfig, config_from_dict
from procap.core.errors import ProCapError
from procap.core.json_files import parse_json, read_json
from procap.core.weights import (
    atomic_save_tensors,
    check_file_fits,
    dedupe_shared,
    load_weights,
    read_header,
    read_tensors,
    restore_aliases,
)
from procap.data import Vocabulary


class CheckpointedModel(nn.Module):
    """A model a checkpoint file holds: built from a :class:`~procap.core.config.ProCapConfig`, its ``config``
    (``ProCap``, through :class:`~procap.model.pretrained.PretrainedMixin`). Declarations only: the model sets
    ``config``; :func:`read_checkpoint` and ``read_pretrained`` set the rest, what the file records about itself,
    on the model they build (a model built in memory may lack them, hence ``getattr`` where they are read)."""

    config: ProCapConfig
    vocab: Vocabulary
    pretrained_info: dict[str, Any]
    trained_stage: str | None
    loaded_from: str | None


ModelT = TypeVar("ModelT", bound=CheckpointedModel)

FORMAT = "procap"
FORMAT_VERSION = "1"

# The stages whose checkpoints hold a trained caption decoder; stage 1 trains the procedure encoder only, so its
# checkpoints captioned '' with exit 0 (and `evaluate` scored the empty captions).
CAPTIONING_STAGES = ("stage2",)


def recorded_stage(metadata: object) -> str | None:
    """The training stage a checkpoint's decoded metadata records (``extra["stage"]``), or ``None``."""
    extra = metadata.get("extra") if isinstance(metadata, dict) else None
    stage = extra.get("stage") if isinstance(extra, dict) else None
    return stage if isinstance(stage, str) else None


def check_stage_can_caption(stage: str | None, source: str | os.PathLike) -> None:
    """Refuse a recorded ``stage`` that does not train the caption decoder; ``None`` (not recorded) passes.

    Raises:
        ProCapError: naming the checkpoint ``source`` and its stage.
    """
    if stage is not None and stage not in CAPTIONING_STAGES:
        raise ProCapError(
            f"checkpoint {os.fspath(source)} records stage {stage!r}, which does not train the caption decoder, so "
            f"its captions would be empty; caption with a stage-2 checkpoint (`procap train --init "
            f"{os.fspath(source)}` makes one)."
        )


# ----------------------------------------------------------------------------------------------- vocabulary
def vocab_to_dict(vocab: Vocabulary) -> dict[str, int]:
    """Word -> index map of a :class:`procap.data.Vocabulary` through its own JSON ``save``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab.json"
        vocab.save(path)
        return read_json(path, "vocabulary file")


def vocab_from_dict(word2idx: dict[str, int], source: str = "vocabulary") -> Vocabulary:
    """Rebuild a :class:`procap.data.Vocabulary` from a word -> index map; errors name ``source``."""
    return Vocabulary.from_dict(word2idx, source)


# ----------------------------------------------------------------------------------------------- model files
def save_checkpoint(
    path: Path | str, model: CheckpointedModel, vocab: Vocabulary, extra: dict[str, Any] | None = None
) -> Path:
    """Write ``model`` (a ProCap), its config and ``vocab`` to one safetensors file, atomically.

    Args:
        path: destination ``.safetensors`` file; parent folders are created.
        model: a :class:`procap.model.procap.ProCap` (any module with a ``config`` attribute).
        vocab: the :class:`procap.data.Vocabulary` the model was trained with.
        extra: JSON-serialisable facts to keep with the weights (step, stage, validation metrics...).

    Returns:
        The path written.
    """
    tensors, aliases = dedupe_shared(model.state_dict())
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": json.dumps(model.config.to_dict()),
        "vocab": json.dumps(vocab_to_dict(vocab)),
        "aliases": json.dumps(aliases),
        "extra": json.dumps(extra or {}),
    }
    atomic_save_tensors(path, tensors, metadata)
    return Path(path)


def read_checkpoint_metadata(path: Path | str) -> dict[str, Any]:
    """Decoded metadata of a ProCap checkpoint (``config``, ``vocab``, ``extra``, ``aliases``) without the weights."""
    _, raw = read_header(path)
    return _decode_metadata(Path(path), raw)


def _decode_metadata(path: Path, raw: dict[str, str]) -> dict[str, Any]:
    if raw.get("format") != FORMAT or "config" not in raw or "vocab" not in raw:
        raise ProCapError(f"checkpoint file {path} is not a ProCap checkpoint (no config/vocabulary in its metadata)")
    decoded = {
        key: parse_json(raw[key], f"the {key} metadata of checkpoint file {path}")
        if key in ("config", "vocab", "aliases", "extra")
        else raw[key]
        for key in raw
    }
    for key in ("config", "vocab"):
        if not isinstance(decoded[key], dict):
            raise ProCapError(f"checkpoint file {path} has a {key} that is not a JSON object")
    return decoded


def _config_and_vocab(path: Path, metadata: dict[str, Any]) -> tuple[ProCapConfig, Vocabulary]:
    """The model config and vocabulary a checkpoint's decoded metadata holds, checked against each other."""
    try:
        config = config_from_dict(ProCapConfig, metadata["config"])
    except ValueError as exc:
        raise ProCapError(f"checkpoint file {path} holds an invalid config ({exc})") from None
    vocab = vocab_from_dict(metadata["vocab"], f"the vocabulary in checkpoint file {path}")
    if len(vocab) != config.vocab_size:
        raise ProCapError(
            f"checkpoint file {path} holds {len(vocab)} vocabulary entries for a model of {config.vocab_size}"
        )
    return config, vocab


def read_checkpoint(
    model_class: Callable[[ProCapConfig], ModelT], path: Path | str, map_location: str | torch.device = "cpu"
) -> tuple[ModelT, Vocabulary, dict[str, Any]]:
    """Rebuild a model and its vocabulary from a checkpoint written by :func:`save_checkpoint`.

    Args:
        model_class: what builds the model from its config (``ProCap``, or the ``cls`` of ``from_pretrained``).
        path: the ``.safetensors`` file.
        map_location: device for the returned model.

    Returns:
        ``(model, vocab, metadata)``: the model in eval mode on ``map_location``, the Vocabulary, and the
        decoded metadata dict (``config``, ``vocab``, ``extra``, ...). The model carries ``extra`` as
        ``model.pretrained_info`` (what ``save_pretrained`` keeps: the stage, scores, ``trained_on``...).

    Raises:
        ProCapError: the file is missing, unreadable, not a ProCap checkpoint, or its tensors do not fit the config.
    """
    path = Path(path)
    if map_location is not None:  # before the file is read: a bad device was a traceback after the load
        map_location = validate.device(str(map_location), "map_location")  # a torch.device's name parses as itself
    _, raw = read_header(path)
    metadata = _decode_metadata(path, raw)
    config, vocab = _config_and_vocab(path, metadata)
    aliases = metadata.get("aliases", {})
    check_file_fits(path, lambda: model_class(config), "checkpoint")  # before a single weight is allocated
    tensors, _ = read_tensors(path)
    model = model_class(config)
    load_weights(model, restore_aliases(tensors, aliases, path), path)
    model.to(map_location).eval()
    # what the weights record (stage, metrics, the training domain...), kept by a later ``save_pretrained``
    extra = metadata.get("extra")
    model.pretrained_info = extra if isinstance(extra, dict) else {}
    if hasattr(model, "trained_stage"):  # what the file says about itself goes with the model (ProCap.generate)
        model.trained_stage, model.loaded_from = recorded_stage(metadata), str(path)
    return model, vocab, metadata
