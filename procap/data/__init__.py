"""Datasets: the registry of benchmarks and their loaders, the caption vocabulary, images, the synthetic benchmark."""

from procap.data.datasets import DATASETS, DatasetSpec, get_dataset, load_split
from procap.data.images import ImageCache, load_image, to_tensor
from procap.data.records import ChangePair
from procap.data.vocab import SPECIALS, Vocabulary, tokenize

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
