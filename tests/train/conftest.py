"""Fixtures for the training tests: a tiny synthetic CLEVR-Change folder and a ProCap far below ``tiny``."""

from __future__ import annotations

import pytest

from tests.support import small_training_config


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

    return ProCap(small_training_config(len(vocab)))


@pytest.fixture
def small_model(monkeypatch):
    """Route ``new_model`` (used by pretrain/train) to the 16 px test configuration."""
    from procap.model.procap import ProCap
    from procap.train import stage1

    def build(preset, vocab, vqgan_path, **overrides):
        return ProCap(small_training_config(len(vocab), **overrides))

    monkeypatch.setattr(stage1, "new_model", build)
