"""Datasets: the registry of benchmarks and their loaders, the caption vocabulary, images, the synthetic benchmark.

The image helpers (``ImageCache``, ``load_image``, ``to_tensor``) need torch; they are imported on first use, so
that the registry and the vocabulary (what the command line builds its parsers from) load without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from procap.data.datasets import DATASETS, DatasetSpec, get_dataset, load_split
from procap.data.records import ChangePair
from procap.data.vocab import SPECIALS, Vocabulary, tokenize

if TYPE_CHECKING:
    from procap.data.images import ImageCache, load_image, to_tensor

_IMAGE_NAMES = ("ImageCache", "load_image", "to_tensor")


def __getattr__(name: str) -> Any:
    if name in _IMAGE_NAMES:
        from procap.data import images  # torch: only when an image helper is asked for

        return getattr(images, name)
    raise AttributeError(f"module 'procap.data' has no attribute {name!r}")


__all__ = [
    "DATASETS",
    "SPECIALS",
    "ChangePair",
    "DatasetSpec",
    "ImageCache",
    "Vocabulary",
    "get_dataset",
    "load_image",
    "load_split",
    "to_tensor",
    "tokenize",
]
