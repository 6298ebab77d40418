"""The Hub layer's face of the model: :func:`load_pretrained`, a ProCap and its vocabulary from any name a
pretrained model can have (a folder, a checkpoint file, ``hf://owner/repo[@revision]``, ``owner/repo``).

The pretrained folder and its reading are the model's own (:mod:`procap.model.pretrained`, what
``ProCap.from_pretrained`` runs), and carrying files to and from the Hub is :mod:`procap.core.hub_files`; this module wraps
that reading with :class:`~procap.model.procap.ProCap` named, for callers that want the vocabulary and the
checkpoint's metadata beside the model (``Captioner.from_pretrained``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from procap.core.hub_files import PretrainedSource
from procap.data import Vocabulary
from procap.model.pretrained import read_pretrained
from procap.model.procap import ProCap


def load_pretrained(
    name_or_path: str | Path | PretrainedSource, *, map_location: str | torch.device = "cpu", **source: Any
) -> tuple[ProCap, Vocabulary, dict[str, Any]]:
    """``(ProCap, vocab, metadata)`` from a pretrained folder, a checkpoint file, ``hf://...`` or ``owner/repo``
    (or a :class:`~procap.core.hub_files.PretrainedSource`, whose fields ``source`` otherwise gives):
    :func:`procap.model.pretrained.read_pretrained` with the model class named."""
    if not isinstance(name_or_path, PretrainedSource):
        name_or_path = PretrainedSource(name_or_path, **source)
    elif source:
        raise TypeError(f"a PretrainedSource carries its options; got {', '.join(sorted(source))} beside it")
    return read_pretrained(ProCap, name_or_path, map_location)
