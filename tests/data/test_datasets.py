"""The dataset registry: one spec per benchmark, cache keys in the authors' layout, one-sentence errors."""

from __future__ import annotations

import pytest

from procap.core.config import PRESETS
from procap.core.errors import ProCapError
from procap.data import DATASETS, get_dataset, load_split
from procap.data.datasets import cache_key, score_subkey


def test_every_spec_is_complete():
    assert sorted(DATASETS) == ["clevr-change", "image-editing-request", "levir-cc", "spot-the-diff"]
    for name, spec in DATASETS.items():
        assert spec.name == name and callable(spec.loader) and spec.cache_groups
        assert spec.min_count >= 1 and 0 < spec.encoder_lr < 1e-3
        assert spec.paper_preset in PRESETS
    assert DATASETS["clevr-change"].change_types == ("color", "material", "add", "drop", "move")
    assert DATASETS["spot-the-diff"].encoder_lr < DATASETS["clevr-change"].encoder_lr  # the paper: 2e-5 vs 5e-5


def test_cache_keys_follow_the_authors_files():
    assert cache_key("CLEVR_semantic_000123.png") == ("sc_videos", "000123.png")
    assert cache_key("CLEVR_nonsemantic_000007.png", "clevr-change") == ("nsc_videos", "000007.png")
    assert cache_key("42", "spot-the-diff") == ("spot_videos", "42")
    assert cache_key("Reddit_1", "image-editing-request") == ("edit_videos", "Reddit_1")
    assert cache_key("x", None) == ("videos", "x")
    with pytest.raises(ProCapError, match="cannot be an HDF5 dataset name"):
        cache_key("a/b", "spot-the-diff")
    assert score_subkey("sc_videos") == "sc" and score_subkey("nsc_videos") == "nsc"
    assert score_subkey("spot_videos") is None


def test_unknown_names_are_one_sentence(tmp_path):
    with pytest.raises(ProCapError, match="unknown dataset 'coco'"):
        get_dataset("coco")
    with pytest.raises(ProCapError, match="unknown split 'dev'"):
        load_split("spot-the-diff", tmp_path, "dev")
