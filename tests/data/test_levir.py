"""LEVIR-CC: the loader on a small generated stand-in of the released layout, its vocabulary rule and preset.

The layout (LEVIR-CC's release, as RSICC's preprocessing reads it): ``LevirCCcaptions.json`` with
``{"images": [{"filepath", "filename", "imgid", "split", "sentences": [{"tokens", "raw", ...}], "sentids",
"changeflag"}]}`` and the images in ``images/<split>/A`` (before) and ``images/<split>/B`` (after).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from procap.core.config import get_preset
from procap.core.errors import ProCapError
from procap.data import DATASETS, load_split
from procap.train.common import build_vocab
from tests.support import write_image

NO_CHANGE = "the scene is the same as before"


def make_levir(root: Path, per_split: dict[str, int]) -> Path:
    """A stand-in of the released layout: five sentences per pair, half the pairs unchanged."""
    entries, imgid, sentid = [], 0, 0
    for split, count in per_split.items():
        for i in range(count):
            name = f"{split}_{i:06d}.png"
            for side in ("A", "B"):
                write_image(root / "images" / split / side / name, seed=imgid * 2 + (side == "B"), size=16)
            changed = i % 2 == 0
            texts = [f"a road is built near the {w} houses" for w in ("new", "old", "red", "small", "big")]
            texts = texts if changed else [NO_CHANGE] * 5
            sentences = [
                {"tokens": text.split(), "raw": f" {text} .", "imgid": imgid, "sentid": sentid + j}
                for j, text in enumerate(texts)
            ]
            entries.append(
                {
                    "filepath": split,
                    "filename": name,
                    "imgid": imgid,
                    "split": split,
                    "sentences": sentences,
                    "sentids": [sentid + j for j in range(5)],
                    "changeflag": int(changed),
                }
            )
            imgid, sentid = imgid + 1, sentid + 5
    (root / "LevirCCcaptions.json").write_text(json.dumps({"images": entries}))
    return root


def test_each_split_reads_its_pairs_with_five_captions(tmp_path):
    root = make_levir(tmp_path, {"train": 4, "val": 2, "test": 3})
    train = load_split("levir-cc", root, "train")
    assert [p.id for p in train] == [f"train_{i:06d}.png" for i in range(4)]
    assert [len(load_split("levir-cc", root, s)) for s in ("val", "test")] == [2, 3]
    first = train[0]
    assert first.before_path == root / "images" / "train" / "A" / "train_000000.png"
    assert first.after_path == root / "images" / "train" / "B" / "train_000000.png"
    assert first.before_path.is_file() and first.after_path.is_file()
    assert first.captions[0] == "a road is built near the new houses" and len(first.captions) == 5
    assert train[1].captions == [NO_CHANGE] * 5


def test_vocabulary_keeps_words_seen_more_than_five_times(tmp_path):
    root = make_levir(tmp_path, {"train": 4})
    vocab = build_vocab(load_split("levir-cc", root, "train"), "levir-cc")
    # Two changed pairs: "road" appears 10 times, "red" twice; the unchanged pairs' words 10 times.
    assert DATASETS["levir-cc"].min_count == 6
    assert "road" in vocab and "same" in vocab and "red" not in vocab


def test_levir_preset_is_256_px_and_is_the_default_for_the_dataset():
    config = get_preset("levir")
    assert config.image_size == 256 and config.grid_size == 16 and DATASETS["levir-cc"].paper_preset == "levir"


def test_a_malformed_captions_file_is_one_sentence(tmp_path):
    (tmp_path / "LevirCCcaptions.json").write_text(json.dumps([{"filename": "x.png"}]))
    with pytest.raises(ProCapError, match="must be a JSON object with an 'images' list"):
        load_split("levir-cc", tmp_path, "train")
    (tmp_path / "LevirCCcaptions.json").write_text(json.dumps({"images": [{"split": "train", "filename": 3}]}))
    with pytest.raises(ProCapError, match="without a filename string"):
        load_split("levir-cc", tmp_path, "train")


def test_the_split_comes_from_each_entrys_split_field_not_its_folder(tmp_path):
    # RSICC's preprocessing reads `split`; `filepath` only says where the images lie.
    root = make_levir(tmp_path, {"train": 3, "test": 1})
    data = json.loads((root / "LevirCCcaptions.json").read_text())
    data["images"][2]["split"] = "val"
    (root / "LevirCCcaptions.json").write_text(json.dumps(data))
    assert [p.id for p in load_split("levir-cc", root, "train")] == ["train_000000.png", "train_000001.png"]
    (moved,) = load_split("levir-cc", root, "val")
    assert moved.id == "train_000002.png" and moved.before_path == root / "images" / "train" / "A" / moved.id


def test_changeflag_gives_the_change_and_no_change_groups(tmp_path):
    from procap.eval.split import breakdown

    pytest.importorskip("pycocoevalcap", reason="the [eval] extra (pycocoevalcap) is not installed")
    root = make_levir(tmp_path, {"test": 5})
    pairs = load_split("levir-cc", root, "test")
    assert [p.change_type for p in pairs] == ["change", "no_change", "change", "no_change", "change"]
    predictions = {p.id: p.captions[0] for p in pairs}
    groups = breakdown(predictions, pairs, ["BLEU-4", "CIDEr"])
    assert sorted(groups) == ["change", "no_change", "total"]
    assert [groups[g]["pairs"] for g in ("total", "change", "no_change")] == [5, 3, 2]
    assert all(set(values) == {"BLEU-4", "CIDEr", "pairs"} for values in groups.values())


def test_an_entry_without_changeflag_has_no_group_and_a_bad_one_is_refused(tmp_path):
    root = make_levir(tmp_path, {"train": 2})
    data = json.loads((root / "LevirCCcaptions.json").read_text())
    del data["images"][0]["changeflag"]
    data["images"][1]["changeflag"] = 2
    (root / "LevirCCcaptions.json").write_text(json.dumps(data))
    with pytest.raises(ProCapError, match="changeflag 2; it must be 0 or 1"):
        load_split("levir-cc", root, "train")
    data["images"][1]["changeflag"] = 0
    (root / "LevirCCcaptions.json").write_text(json.dumps(data))
    assert [p.change_type for p in load_split("levir-cc", root, "train")] == [None, "no_change"]
