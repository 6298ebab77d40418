"""Datasets: benchmark loaders, the caption vocabulary, image loading and the synthetic benchmark."""

from procap.data.images import load_image, to_tensor
from procap.data.loaders import LOADERS, load_split
from procap.data.records import ChangePair
from procap.data.vocab import SPECIALS, Vocabulary, tokenize

__all__ = ["LOADERS", "SPECIALS", "ChangePair", "Vocabulary", "load_image", "load_split", "to_tensor", "tokenize"]
