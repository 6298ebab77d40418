"""The same image twice is no change: stage 2's added identical pairs (``TrainConfig.identical_pairs``) and the
identical-pair rate the demo reports (``procap.eval.split.identical_pair_rate``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from procap.core.errors import ProCapError
from procap.data.records import ChangePair
from procap.eval.split import identical_pairs
from procap.train.config import TrainConfig
from procap.train.datasets import identical_training_pairs


def _split(scenes: int = 10) -> list[ChangePair]:
    """CLEVR-Change's shape: per scene a change pair and a distractor pair sharing the before image."""
    pairs = []
    for i in range(scenes):
        before = Path(f"/data/images/before_{i}.png")
        pairs.append(ChangePair(f"sc_{i}", before, Path(f"/data/sc/after_{i}.png"), [f"the cube {i} moved"], "move"))
        pairs.append(ChangePair(f"nsc_{i}", before, Path(f"/data/nsc/after_{i}.png"), [f"no change {i}"], "no_change"))
    return pairs


def test_added_pairs_show_one_training_image_twice_with_the_splits_no_change_captions():
    pairs = _split()
    added = identical_training_pairs(pairs, 0.25, seed=3)
    assert len(added) == 5  # a quarter of 20 pairs
    images = {path for pair in pairs for path in (pair.before_path, pair.after_path)}
    no_change = [pair.captions for pair in pairs if pair.change_type == "no_change"]
    for pair in added:
        assert pair.before_path == pair.after_path and pair.before_path in images
        assert pair.captions in no_change and pair.change_type == "no_change"
    assert len({pair.id for pair in added}) == len(added) and not {p.id for p in added} & {p.id for p in pairs}
    assert len({pair.before_path for pair in added}) == 5  # drawn without repeats while there are images enough


def test_the_draw_is_the_seeds():
    pairs = _split()
    assert identical_training_pairs(pairs, 0.5, seed=1) == identical_training_pairs(pairs, 0.5, seed=1)
    assert identical_training_pairs(pairs, 0.5, seed=1) != identical_training_pairs(pairs, 0.5, seed=2)


def test_none_are_added_at_zero_and_a_split_without_no_change_pairs_is_refused():
    pairs = _split()
    assert identical_training_pairs(pairs, 0.0) == []
    changes_only = [pair for pair in pairs if pair.change_type != "no_change"]
    with pytest.raises(ProCapError, match="no-change pairs"):
        identical_training_pairs(changes_only, 0.2)


def test_more_pairs_than_images_repeat_images():
    pairs = _split(2)  # 4 pairs, 6 images
    added = identical_training_pairs(pairs, 1.0)
    assert len(added) == 4
    assert len(identical_training_pairs(pairs * 5, 1.0)) == 20  # 20 pairs from 6 images


def test_the_share_is_bounded():
    with pytest.raises(ProCapError, match="identical_pairs"):
        TrainConfig(stage="train", out="/tmp/x", identical_pairs=1.5)
    assert TrainConfig(stage="train", out="/tmp/x").identical_pairs == 0.0  # the paper's: none


def test_the_rate_tries_every_distinct_image_of_the_pairs_once():
    pairs = _split(3)
    identical = identical_pairs(pairs)
    assert len(identical) == 9  # 3 befores shared by two pairs each, 6 afters
    assert all(pair.before_path == pair.after_path and pair.id == str(pair.before_path) for pair in identical)
    assert len({pair.id for pair in identical}) == 9


def test_the_rate_counts_the_captions_that_claim_no_change(trained, vocab, pairs, tmp_path):
    """The conftest model writes made-up words, never "no change": every image tried counts as a change, and the
    examples hold at most five of them with their captions."""
    import torch
    from PIL import Image

    from procap.eval.split import identical_pair_rate

    model = trained[0]
    before, after = pairs
    listed = []
    for index in range(3):
        paths = []
        for name, batch in (("before", before), ("after", after)):
            path = tmp_path / f"{name}{index}.png"
            Image.fromarray((batch[index].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()).save(path)
            paths.append(path)
        listed.append(ChangePair(f"pair{index}", paths[0], paths[1], ["x"], "move"))
    result = identical_pair_rate(model, vocab, listed, progress=False)
    assert result["pairs"] == 6 and result["no_change"] == 0 and result["rate"] == 0.0
    assert len(result["examples"]) == 5 and all(example["caption"] for example in result["examples"])
    assert identical_pair_rate(model, vocab, [], progress=False)["rate"] is None
