"""Small configurations and inputs shared by the model tests."""

from __future__ import annotations

import torch

from procap.config import VQGANConfig, get_preset
from procap.model.decoder import BOS_ID, EOS_ID, NUM_SPECIALS, PAD_ID


def small_vqgan_config(**overrides) -> VQGANConfig:
    """f4 VQGAN on 16 px images: 4x4 latents; attention at nominal 8 (level 1) and in the mid block."""
    base = {
        "resolution": 16,
        "ch": 32,
        "ch_mult": (1, 1, 2),
        "num_res_blocks": 1,
        "attn_resolutions": (8,),
        "z_channels": 32,
        "embed_dim": 16,
        "n_embed": 64,
    }
    return VQGANConfig(**{**base, **overrides})


def small_config(**overrides):
    """A ProCap config on 16 px images (4x4 grid), k = 1, one-layer 32-wide encoder and decoder."""
    base = {
        "vqgan": small_vqgan_config(),
        "image_size": 16,
        "vocab_size": 20,
        "max_caption_len": 8,
        "num_keyframes": 1,
        "enc_dim": 32,
        "enc_heads": 2,
        "enc_mlp": 64,
        "enc_layers": 1,
        "dec_dim": 32,
        "dec_heads": 2,
        "dec_ffn": 64,
        "dec_layers": 1,
        "dropout": 0.0,
        # the first tiny departures only; the object-naming ones have their own tests (test_object_naming.py)
        "difference_mode": "absolute",
        "token_merge": 1,
        "change_token": False,
        "change_window": 0,
        "change_broadcast": False,
        "change_pixels": False,
        "pixel_cnn": 0,
        "standardize_features": False,
    }
    return get_preset("tiny", **{**base, **overrides})


def random_captions(batch: int, length: int, vocab: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, L) BOS w... EOS PAD... captions with distinct word sequences per row."""
    words = torch.randint(NUM_SPECIALS, vocab, (batch, length), generator=generator)
    words[:, 0] = BOS_ID
    for b in range(batch):
        end = 2 + (b % (length - 2))
        words[b, end] = EOS_ID
        words[b, end + 1 :] = PAD_ID
    return words
