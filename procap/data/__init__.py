"""Datasets, vocabulary and image preprocessing (docs/architecture.md, "Data contracts")."""

from procap.data.images import load_image
from procap.data.loaders import LOADERS, load_split
from procap.data.records import ChangePair
from procap.data.vocab import SPECIALS, Vocabulary, tokenize

__all__ = ["ChangePair", "LOADERS", "SPECIALS", "Vocabulary", "load_image", "load_split", "tokenize"]
