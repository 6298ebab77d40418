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
from procap.model.checkpoint_file import (
    CAPTIONING_STAGES,
    FORMAT,
    FORMAT_VERSION,
    check_stage_can_caption,
    read_checkpoint,
    read_checkpoint_metadata,
    recorded_stage,
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


def check_can_caption(metadata: dict[str, Any], source: str | Path) -> None:
    """Refuse a checkpoint whose recorded stage cannot caption; one without a recorded stage passes.

    A model loaded by hand carries the same record, and :meth:`ProCap.generate` refuses it too.

    Args:
        metadata: the decoded metadata of :func:`load_checkpoint` or :func:`procap.loading.hub.load_pretrained`.
        source: how the message names the checkpoint (its path or Hub name).

    Raises:
        ProCapError: the checkpoint records a stage that does not train the caption decoder.
    """
    check_stage_can_caption(recorded_stage(metadata), source)
