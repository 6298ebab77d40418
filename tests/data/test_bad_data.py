"""Bad data files: 16-bit and oversized images, wrongly typed annotation fields, and arbitrary JSON in every
loader's files (property-based): the loaders return well-typed pairs or raise one sentence naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from procap.core.errors import ProCapError
from procap.data import load_image, load_split
from procap.data.images import MAX_PIXELS_ENV
from procap.data.synthetic import generate
from tests.support import make_edit, make_spot


# ------------------------------------------------------------------------------------------ images
def test_sixteen_bit_png_is_scaled_by_its_depth(tmp_path):
    """A 16-bit PNG is scaled by its bit depth: it loads like the same image saved with 8 bits."""
    ramp = np.linspace(0, 65535, 32 * 32).reshape(32, 32).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "g16.png")
    Image.fromarray(np.rint(ramp / 257.0).astype(np.uint8)).save(tmp_path / "g8.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I")
    sixteen, eight = load_image(tmp_path / "g16.png", 32), load_image(tmp_path / "g8.png", 32)
    assert (sixteen - eight).abs().max() <= 1 / 255 + 1e-6
    assert 0.45 < sixteen.mean() < 0.55


def test_float_images_are_refused_with_the_file_name(tmp_path):
    Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32)).save(tmp_path / "f.tiff")
    with pytest.raises(ProCapError, match="f.tiff.*floating-point"):
        load_image(tmp_path / "f.tiff", 8)


def test_an_image_above_the_pixel_limit_names_the_file_and_the_override(tmp_path, monkeypatch):
    """An image above the pixel limit is one sentence naming the file and the variable that raises the limit."""
    Image.new("RGB", (40, 30)).save(tmp_path / "big.png")
    monkeypatch.setenv(MAX_PIXELS_ENV, "1000")
    with pytest.raises(ProCapError, match=f"big.png has more than 1,000 pixels.*{MAX_PIXELS_ENV}"):
        load_image(tmp_path / "big.png", 16)
    monkeypatch.setenv(MAX_PIXELS_ENV, "1200")  # the documented override
    assert load_image(tmp_path / "big.png", 16).shape == (3, 16, 16)
    monkeypatch.setenv(MAX_PIXELS_ENV, "lots")
    with pytest.raises(ProCapError, match=MAX_PIXELS_ENV):
        load_image(tmp_path / "big.png", 16)


def test_pillow_keeps_its_own_limit_outside_procap(tmp_path, monkeypatch):
    before = Image.MAX_IMAGE_PIXELS
    Image.new("RGB", (4, 4)).save(tmp_path / "small.png")
    monkeypatch.setenv(MAX_PIXELS_ENV, "100")
    load_image(tmp_path / "small.png", 4)
    assert Image.MAX_IMAGE_PIXELS == before


def test_a_directory_is_not_reported_as_missing(tmp_path):
    with pytest.raises(ProCapError, match="is a directory"):
        load_image(tmp_path, 8)


# ------------------------------------------------------------------------------------------ typed fields
@pytest.mark.parametrize(
    "entry,message",
    [
        ({"img0": 7, "img1": "b.png", "sents": ["x"], "uid": "1"}, "img0 that is not a file name"),
        ({"img0": "a.png", "img1": None, "sents": ["x"], "uid": "1"}, "img1 that is not a file name"),
        ({"img0": "a.png", "img1": "b.png", "sents": ["x"], "uid": [1]}, "uid of type list"),
        ({"img0": "a.png", "img1": "b.png", "sents": ["x", 3], "uid": "1"}, "list of caption strings"),
    ],
)
def test_image_editing_request_fields_are_typed(tmp_path, entry, message):
    """Wrongly typed Image-Editing-Request fields (a non-string img0...) are one sentence naming the file."""
    (tmp_path / "train.json").write_text(json.dumps([entry]))
    with pytest.raises(ProCapError, match=message) as info:
        load_split("image-editing-request", tmp_path, "train")
    assert "train.json" in str(info.value)


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"img_id": {"a": 1}, "sentences": ["x"]}, "img_id of type dict"),
        ({"img_id": True, "sentences": ["x"]}, "img_id of type bool"),
        ({"img_id": "1", "sentences": [None]}, "list of caption strings"),
    ],
)
def test_spot_the_diff_fields_are_typed(tmp_path, entry, message):
    """Wrongly typed Spot-the-Diff fields (a dict img_id, non-string sentences) are refused with one sentence."""
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "train.json").write_text(json.dumps([entry]))
    with pytest.raises(ProCapError, match=message):
        load_split("spot-the-diff", tmp_path, "train")


def test_clevr_change_split_indices_are_integers_not_booleans(tmp_path):
    generate(tmp_path, 4, size=16, seed=1, progress=False)
    (tmp_path / "splits.json").write_text(json.dumps({"train": [True, 1], "val": [], "test": []}))
    with pytest.raises(ProCapError, match="int scene indices"):
        load_split("clevr-change", tmp_path, "train")


# ------------------------------------------------------------------------------------------ properties
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)
_ENTRY_FIELDS = {
    "spot-the-diff": ("img_id", "sentences"),
    "image-editing-request": ("img0", "img1", "sents", "uid"),
}


def _entries(dataset: str) -> st.SearchStrategy:
    """Lists of entries with the loader's field names and arbitrary values (or arbitrary JSON)."""
    fields = _ENTRY_FIELDS[dataset]
    entry = st.fixed_dictionaries({f: _JSON for f in fields}) | st.dictionaries(st.sampled_from(fields), _JSON)
    return st.lists(entry, max_size=4) | _JSON


def _check(pairs: list, path: Path) -> None:
    for pair in pairs:
        assert isinstance(pair.id, str) and isinstance(pair.captions, list) and pair.captions
        assert all(isinstance(c, str) and c for c in pair.captions)
        assert isinstance(pair.before_path, Path) and isinstance(pair.after_path, Path)


def _load_or_one_sentence(dataset: str, root: Path, path: Path) -> None:
    try:
        pairs = load_split(dataset, root, "train")
    except ProCapError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return
    _check(pairs, path)


@settings(max_examples=60, deadline=None)
@given(data=_entries("spot-the-diff"))
def test_spot_the_diff_annotations_of_any_shape(tmp_path_factory, data):
    root = make_spot(tmp_path_factory.mktemp("spot"))
    path = root / "annotations" / "train.json"
    path.write_text(json.dumps(data))
    _load_or_one_sentence("spot-the-diff", root, path)


@settings(max_examples=60, deadline=None)
@given(data=_entries("image-editing-request"))
def test_image_editing_request_annotations_of_any_shape(tmp_path_factory, data):
    root = make_edit(tmp_path_factory.mktemp("edit"))
    path = root / "train.json"
    path.write_text(json.dumps(data))
    _load_or_one_sentence("image-editing-request", root, path)


@pytest.fixture(scope="module")
def clevr_files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clevr")
    generate(root, 6, size=16, seed=4, progress=False)
    return root


_CLEVR_FILES = ("splits.json", "change_captions.json", "no_change_captions.json", "type_mapping.json")
_NAME = st.sampled_from(["CLEVR_default_000001.png", "000002.png", "x.png", "7"]) | st.text(max_size=6)


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(_CLEVR_FILES),
    data=_JSON
    | st.dictionaries(st.sampled_from(["train", "val", "test"]), st.lists(st.integers(-2, 8) | _JSON, max_size=4))
    | st.dictionaries(_NAME, st.lists(st.text(max_size=8) | _JSON, max_size=3), max_size=4),
)
def test_clevr_change_files_of_any_shape(clevr_files, tmp_path_factory, name, data):
    import shutil

    root = tmp_path_factory.mktemp("clevr_case")
    for file in _CLEVR_FILES:
        shutil.copy(clevr_files / file, root / file)
    (root / name).write_text(json.dumps(data))
    try:
        pairs = load_split("clevr-change", root, "train")
    except ProCapError as exc:
        assert "\n" not in str(exc) and str(root) in str(exc)
        return
    _check(pairs, root / name)
