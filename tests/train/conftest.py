"""Fixtures for the training tests: a tiny synthetic CLEVR-Change folder and a ProCap far below ``tiny``."""

from __future__ import annotations

import pytest

from procap.config import VQGANConfig, get_preset


def small_config(vocab_size: int, **overrides):
    """16 px images, f4 VQGAN (4x4 grid), k = 1, one-layer 32-wide encoder and decoder, no dropout."""
    vqgan = VQGANConfig(
        resolution=16,
        ch=32,
        ch_mult=(1, 1, 2),
        num_res_blocks=1,
        attn_resolutions=(8,),
        z_channels=32,
        embed_dim=16,
        n_embed=64,
    )
    base = {
        "vqgan": vqgan,
        "image_size": 16,
        "vocab_size": vocab_size,
        "max_caption_len": 12,
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
        # the first tiny departures only: the object-naming ones (docs/model.md) include a BatchNorm, whose batch
        # statistics would make the split-step equality tests (torchrun, --grad-accum) approximate
        "difference_mode": "absolute",
        "token_merge": 1,
        "change_token": False,
        "change_window": 0,
        "change_broadcast": False,
        "pixel_cnn": 0,
        "change_pixels": False,
        "standardize_features": False,
    }
    return get_preset("tiny", **{**base, **overrides})


@pytest.fixture(scope="session")
def clevr_root(tmp_path_factory):
    """A 12-scene synthetic CLEVR-Change benchmark at 16 px (the real loader reads it)."""
    from procap.data.synthetic import generate

    root = tmp_path_factory.mktemp("clevr")
    generate(root, 12, size=16, seed=3, progress=False)
    return root


@pytest.fixture(scope="session")
def train_pairs(clevr_root):
    from procap.data import load_split

    return load_split("clevr-change", clevr_root, "train")


@pytest.fixture(scope="session")
def vocab(train_pairs):
    from procap.train.common import build_vocab

    return build_vocab(train_pairs, "clevr-change")


@pytest.fixture
def model(vocab):
    from procap.model.procap import ProCap

    return ProCap(small_config(len(vocab)))
