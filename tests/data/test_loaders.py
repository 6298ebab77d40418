import json
from collections import Counter

import pytest
import torch

from procap.core.errors import ProCapError
from procap.data import ChangePair, load_image, load_split
from procap.data.synthetic import generate
from tests.support import make_edit, make_spot, write_image


def test_spot_merges_repeated_ids_and_drops_empty_sentences(tmp_path):
    root = make_spot(tmp_path / "spot")
    pairs = load_split("spot-the-diff", root, "train")
    assert [p.id for p in pairs] == ["1"]  # id 2 had only an empty sentence
    assert pairs[0].captions == ["the car is gone", "a person appeared"]
    assert pairs[0].before_path.name == "1.png" and pairs[0].after_path.name == "1_2.png"
    assert pairs[0].change_type is None


def test_edit_reads_valid_json_as_val_and_keeps_extensions(tmp_path):
    root = make_edit(tmp_path / "edit")
    val = load_split("image-editing-request", root, "val")
    assert val == load_split("image-editing-request", root, "valid")
    assert val[0] == ChangePair(
        "Zhopped_2", root / "c.gif", root / "d.jpeg", ["remove the dog", "delete dog", "no dog"], None
    )
    assert load_split("image-editing-request", root, "test")[0].after_path.suffix == ".JPG"


def test_clevr_change_gives_change_and_distractor_pairs(tmp_path):
    root = tmp_path / "clevr"
    generate(root, scenes=15, size=32, seed=3, progress=False)
    pairs = load_split("clevr-change", root, "train")
    kinds = Counter(p.change_type for p in pairs)
    assert kinds["no_change"] == len(pairs) // 2
    assert set(kinds) == {"color", "material", "add", "drop", "move", "no_change"}
    for pair in pairs:
        assert pair.before_path.is_file() and pair.after_path.is_file() and pair.captions
        prefix = "CLEVR_nonsemantic_" if pair.change_type == "no_change" else "CLEVR_semantic_"
        assert pair.id.startswith(prefix) and pair.after_path.name == pair.id


def test_synthetic_layout_round_trips_with_every_type_in_every_split(tmp_path):
    root = tmp_path / "clevr"
    generate(root, scenes=50, size=32, seed=0, progress=False)
    for split in ("train", "val", "test"):
        kinds = {p.change_type for p in load_split("clevr-change", root, split)}
        assert kinds == {"color", "material", "add", "drop", "move", "no_change"}, split


@pytest.mark.parametrize(
    "name,split,message",
    [
        ("clevr-change", "train", "does not exist"),
        ("nope", "train", "unknown dataset"),
        ("spot-the-diff", "dev", "unknown split"),
    ],
)
def test_bad_arguments_get_one_sentence(tmp_path, name, split, message):
    with pytest.raises(ProCapError, match=message):
        load_split(name, tmp_path / "missing", split)


def test_malformed_annotation_names_the_file(tmp_path):
    root = make_spot(tmp_path / "spot")
    (root / "annotations" / "val.json").write_text("{not json")
    with pytest.raises(ProCapError, match="val.json"):
        load_split("spot-the-diff", root, "val")
    (root / "annotations" / "test.json").write_text('[{"img": 1}]')
    with pytest.raises(ProCapError, match="img_id"):
        load_split("spot-the-diff", root, "test")


@pytest.mark.parametrize("name,fmt", [("x.png", None), ("y.JPG", "JPEG"), ("z.gif", "GIF")])
def test_load_image_shape_range_and_formats(tmp_path, name, fmt):
    write_image(tmp_path / name, seed=1, size=20, fmt=fmt)
    image = load_image(tmp_path / name, 16)
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.std() > 0


def test_load_image_errors_name_the_file(tmp_path):
    with pytest.raises(ProCapError, match="missing.png"):
        load_image(tmp_path / "missing.png", 8)
    (tmp_path / "broken.png").write_bytes(b"not an image")
    with pytest.raises(ProCapError, match="broken.png"):
        load_image(tmp_path / "broken.png", 8)


def _clevr_by_hand(root):
    """CLEVR-Change in the real release's format, written by hand (prefix-less type_mapping names)."""
    for i in range(3):
        for sub, name in (("images", "default"), ("sc_images", "semantic"), ("nsc_images", "nonsemantic")):
            write_image(root / sub / f"CLEVR_{name}_{i:06d}.png", seed=i)
    (root / "splits.json").write_text(json.dumps({"train": [2, 0, 1], "val": [], "test": []}))
    (root / "type_mapping.json").write_text(json.dumps({"color": ["000000.png"], "move": ["000002.png"]}))
    caps = {f"CLEVR_default_{i:06d}.png": [f"caption {i}"] for i in range(3)}
    (root / "change_captions.json").write_text(json.dumps(caps))
    (root / "no_change_captions.json").write_text(json.dumps({k: ["no change"] for k in caps}))
    return root


def test_clevr_real_format_by_hand_skips_scenes_without_a_type(tmp_path):
    root = _clevr_by_hand(tmp_path / "clevr")
    with pytest.warns(UserWarning, match="1 scene"):
        pairs = load_split("clevr-change", root, "train")
    assert [(p.id, p.change_type, p.captions) for p in pairs] == [
        ("CLEVR_semantic_000002.png", "move", ["caption 2"]),
        ("CLEVR_nonsemantic_000002.png", "no_change", ["no change"]),
        ("CLEVR_semantic_000000.png", "color", ["caption 0"]),
        ("CLEVR_nonsemantic_000000.png", "no_change", ["no change"]),
    ]
    assert pairs[0].before_path == root / "images" / "CLEVR_default_000002.png"
    (root / "splits.json").write_text(json.dumps({"train": ["a"]}))
    with pytest.raises(ProCapError, match="splits.json"):
        load_split("clevr-change", root, "train")
    (root / "splits.json").write_text(json.dumps({"train": [0]}))
    (root / "type_mapping.json").write_text(json.dumps({"color": ["default.png"]}))
    with pytest.raises(ProCapError, match="type_mapping.json"):
        load_split("clevr-change", root, "train")
