"""A memo of the frozen VQGAN's outputs, so CPU training does not re-encode the same images every epoch.

The tokenizer is frozen and has no randomness, so ``features(x)`` and ``codes(x)`` are pure functions of the image.
:meth:`procap.model.vqgan.VQGAN.memoize` gives the VQGAN a :class:`FeatureMemo`: ``features`` / ``codes`` then look
each image up by a fingerprint of its exact values and run the network on the images not seen. A remembered result
equals what the tokenizer gives for that image up to the convolution backend's batch-size-dependent rounding
(~1e-6), the same variation the VQGAN without a memo shows between batch compositions. Only
:meth:`procap.model.vqgan.VQGAN.remember` stores entries (training calls it with the clean dataset frames of a
batch): fresh augmentations (colour-shifted or warped consistency negatives) miss and are computed but never stored,
so memory stays bounded by the dataset.

The key is a BLAKE2b digest of the image's bytes (about 50 us for a 64 px image): bit-identical images share a key,
anything else misses (a 128-bit collision is not a practical concern).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

KINDS = ("features", "codes")


class FeatureMemo:
    """Per-image ``features`` / ``codes`` results, kept on the CPU.

    Attributes:
        max_items: entries kept per kind at most (later images are computed every time).
        hits, misses: images found and computed since the memo was made.
    """

    def __init__(self, max_items: int = 200_000) -> None:
        self.max_items = max_items
        self.tables: dict[str, dict[bytes, torch.Tensor]] = {kind: {} for kind in KINDS}
        self.hits = self.misses = 0

    @staticmethod
    def keys(images: torch.Tensor) -> list[bytes]:
        flat = images.detach().to("cpu").contiguous().flatten(1).numpy()
        shape = str(tuple(images.shape[1:])).encode() + str(images.dtype).encode()
        return [hashlib.blake2b(row.tobytes() + shape, digest_size=16).digest() for row in flat]

    def lookup(
        self, kind: str, images: torch.Tensor, compute: Callable[[torch.Tensor], torch.Tensor], store: bool = False
    ) -> torch.Tensor:
        """``compute(images)``, with each image's row taken from the memo when it is there (stored when ``store``)."""
        table = self.tables[kind]
        keys = self.keys(images)
        missing = [i for i, k in enumerate(keys) if k not in table]
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        fresh = {}
        if missing:
            out = compute(images[missing])
            for row, i in enumerate(missing):
                fresh[keys[i]] = out[row]
                if store and len(table) < self.max_items:
                    table[keys[i]] = out[row].detach().to("cpu")
        rows = [fresh[k] if k in fresh else table[k] for k in keys]
        return torch.stack([r.to(images.device) for r in rows])

    def __len__(self) -> int:
        return len(self.tables["features"])

    def clear(self) -> None:
        for table in self.tables.values():
            table.clear()
