"""Memo of the frozen VQGAN's outputs, so CPU training does not re-encode the same images every epoch.

The tokenizer is frozen and has no randomness, so ``features(x)`` and ``codes(x)`` are pure functions of
the image. :class:`CachedVQGAN` is a drop-in :class:`~procap.model.vqgan.VQGAN` (same submodules, same
state-dict keys) that remembers per-image results keyed by a fingerprint of the image's exact values and
only runs the network on images it has not seen. A remembered result equals what the tokenizer gives for that
image up to the convolution backend's batch-size-dependent rounding (~1e-6), the same variation the uncached
model shows between batch compositions. Fresh augmentations (colour-shifted or warped consistency
negatives) simply miss and are computed; they are not stored, so memory stays bounded by the dataset.

The key is a BLAKE2b digest of the image's bytes (about 50 us for a 64 px image): bit-identical images share
a key, anything else misses (a 128-bit collision is not a practical concern).
"""

from __future__ import annotations

import hashlib

import torch

from procap.model.vqgan import VQGAN


class CachedVQGAN(VQGAN):
    """A VQGAN whose ``features``/``codes`` consult a per-image cache (CPU tensors).

    Use :meth:`wrap` to turn a model's tokenizer into a cached one that shares its parameters. Only
    :meth:`remember` adds entries (call it with the clean dataset frames of a batch); ``features``/``codes``
    look up and compute misses without storing them, so augmented images never grow the cache.
    """

    def __init__(self, config, max_items: int = 200_000) -> None:
        super().__init__(config)
        self.max_items = max_items
        self._cache: dict[str, dict[bytes, torch.Tensor]] = {"features": {}, "codes": {}}
        self.hits = self.misses = 0

    @classmethod
    def wrap(cls, vqgan: VQGAN, max_items: int = 200_000) -> CachedVQGAN:
        """A cached VQGAN sharing ``vqgan``'s modules (no copy of the weights)."""
        cached = cls.__new__(cls)
        torch.nn.Module.__init__(cached)
        cached.__dict__.update({k: v for k, v in vqgan.__dict__.items() if k != "_modules"})
        cached._modules = vqgan._modules  # same submodules -> same parameters and state-dict keys
        cached.max_items = max_items
        cached._cache = {"features": {}, "codes": {}}
        cached.hits = cached.misses = 0
        return cached

    @staticmethod
    def _keys(images: torch.Tensor) -> list[bytes]:
        flat = images.detach().to("cpu").contiguous().flatten(1).numpy()
        shape = str(tuple(images.shape[1:])).encode() + str(images.dtype).encode()
        return [hashlib.blake2b(row.tobytes() + shape, digest_size=16).digest() for row in flat]

    def _lookup(self, kind: str, images: torch.Tensor, compute, store: bool = False) -> torch.Tensor:
        table = self._cache[kind]
        keys = self._keys(images)
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

    @torch.no_grad()
    def remember(self, images: torch.Tensor, codes: bool = True) -> None:
        """Compute and store features (and codes) of clean images (B, 3, S, S) not cached yet."""
        self._lookup("features", images, super().features, store=True)
        if codes:
            self._lookup("codes", images, super().codes, store=True)

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Cached :meth:`VQGAN.features`: (B, 3, S, S) -> (B, z_channels, h, w)."""
        return self._lookup("features", images, super().features)

    @torch.no_grad()
    def codes(self, images: torch.Tensor) -> torch.Tensor:
        """Cached :meth:`VQGAN.codes`: (B, 3, S, S) -> (B, h*w)."""
        return self._lookup("codes", images, super().codes)

    def clear(self) -> None:
        for table in self._cache.values():
            table.clear()


def cache_tokenizer(model: torch.nn.Module, max_items: int = 200_000) -> CachedVQGAN:
    """Replace ``model.vqgan`` by a :class:`CachedVQGAN` over the same weights; returns it."""
    if isinstance(model.vqgan, CachedVQGAN):
        return model.vqgan
    model.vqgan = CachedVQGAN.wrap(model.vqgan, max_items)
    return model.vqgan
