"""ProCap checkpoints without pickle: model weights, config and vocabulary in one safetensors file.

The format is the model's own, :mod:`procap.model.checkpoint_file`: it builds whichever model class it is handed, so
``ProCap.from_pretrained`` reads it from below. This module is that format for the library's callers, with
:func:`load_checkpoint` naming :class:`~procap.model.procap.ProCap`; it sits above the model for that reason alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from procap.data import Vocabulary
from procap.errors import ProCapError
from procap.model.checkpoint_file import (
    FORMAT,
    FORMAT_VERSION,
    read_checkpoint,
    read_checkpoint_metadata,
    save_checkpoint,
    vocab_from_dict,
    vocab_to_dict,
)
from procap.model.procap import ProCap

__all__ = [
    "CAPTIONING_STAGES",
    "FORMAT",
    "FORMAT_VERSION",
    "check_can_caption",
    "load_checkpoint",
    "read_checkpoint_metadata",
    "save_checkpoint",
    "vocab_from_dict",
    "vocab_to_dict",
]


def load_checkpoint(
    path: Path | str, map_location: str | torch.device = "cpu"
) -> tuple[ProCap, Vocabulary, dict[str, Any]]:
    """``(ProCap, vocab, metadata)`` from a checkpoint written by :func:`save_checkpoint`:
    :func:`procap.model.checkpoint_file.read_checkpoint` with the model class named."""
    return read_checkpoint(ProCap, path, map_location)


# The stages whose checkpoints hold a trained caption decoder; stage 1 trains the procedure encoder only, so its
# checkpoints captioned '' with exit 0 (and `evaluate` scored the empty captions).
CAPTIONING_STAGES = ("stage2",)


def check_can_caption(metadata: dict[str, Any], source: str | Path) -> None:
    """Refuse a checkpoint whose recorded stage cannot caption; one without a recorded stage passes.

    Args:
        metadata: the decoded metadata of :func:`load_checkpoint` or :func:`procap.hub.load_pretrained`.
        source: how the message names the checkpoint (its path or Hub name).

    Raises:
        ProCapError: the checkpoint records a stage that does not train the caption decoder.
    """
    extra = metadata.get("extra") if isinstance(metadata, dict) else None
    stage = extra.get("stage") if isinstance(extra, dict) else None
    if stage is not None and stage not in CAPTIONING_STAGES:
        raise ProCapError(
            f"checkpoint {source} records stage {stage!r}, which does not train the caption decoder, so its captions "
            f"would be empty; caption with a stage-2 checkpoint (`procap train --init {source}` makes one)."
        )
