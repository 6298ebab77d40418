"""Photographs reach the model as they are shown: the EXIF orientation tag is applied by the one image loader, for
files and for PIL images handed to the Captioner alike (issue 39, class F)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from procap.data import load_image
from procap.data.images import EXIF_ORIENTATION, to_tensor
from procap.fast.inputs import to_image_batch

SIDE = 24
RED, BLUE = (230, 20, 20), (20, 20, 230)


def _shown() -> Image.Image:
    """What the viewer sees: blue with a red top-left quarter, so every turn and mirror moves the red."""
    image = Image.new("RGB", (SIDE, SIDE), BLUE)
    image.paste(RED, (0, 0, SIDE // 2, SIDE // 2))
    return image


# orientation tag -> how a camera stores the shown picture (the inverse of what the tag tells a viewer to do)
STORED = {
    3: Image.Transpose.ROTATE_180,
    6: Image.Transpose.ROTATE_90,  # the tag says: turn 90 degrees clockwise to show it
    8: Image.Transpose.ROTATE_270,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
}


def _photo(path, orientation: int | None) -> None:
    """A JPEG of :func:`_shown` stored the way a camera held at ``orientation`` stores it, with its tag."""
    stored = _shown() if orientation is None else _shown().transpose(STORED[orientation])
    exif = Image.Exif()
    if orientation is not None:
        exif[EXIF_ORIENTATION] = orientation
    stored.save(path, format="JPEG", quality=95, exif=exif.tobytes())


def _red_at_top_left(image: torch.Tensor) -> bool:
    """(3, SIDE, SIDE) pixels: the red quarter is the top-left one (quarters' centres, away from JPEG edges)."""
    half, margin = SIDE // 2, 3
    quarters = {
        (row, col): image[
            :, row * half + margin : (row + 1) * half - margin, col * half + margin : (col + 1) * half - margin
        ]
        for row in (0, 1)
        for col in (0, 1)
    }
    red = {key: bool(q[0].mean() > q[2].mean() + 0.5) for key, q in quarters.items()}
    return red == {(0, 0): True, (0, 1): False, (1, 0): False, (1, 1): False}


def _stored_pixels(path) -> torch.Tensor:
    """The pixels as the file stores them, no tag applied."""
    with Image.open(path) as raw:
        array = np.asarray(raw.convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255.0


@pytest.mark.parametrize("orientation", [None, 3, 6, 8, 2])
def test_a_photo_is_loaded_as_it_is_shown(tmp_path, orientation):
    path = tmp_path / "photo.jpg"
    _photo(path, orientation)
    # the file's own pixels are turned (red elsewhere) unless there is no tag: ignoring it would fail below
    assert _red_at_top_left(_stored_pixels(path)) == (orientation is None)
    assert _red_at_top_left(load_image(path, SIDE))


def test_the_stored_pixels_are_turned_exactly_by_the_tag(tmp_path):
    """Orientation 6 is the stored pixels turned 90 degrees clockwise: the loader's result equals that turn made
    by hand on the decoded pixels (a permutation, so the tensors are equal, JPEG artefacts and all)."""
    path = tmp_path / "photo.jpg"
    _photo(path, 6)
    with Image.open(path) as raw:
        stored = np.asarray(raw.convert("RGB"))
    by_hand = Image.fromarray(np.ascontiguousarray(np.rot90(stored, k=-1)))
    assert torch.equal(load_image(path, SIDE), to_tensor(by_hand, SIDE))
    assert torch.equal(load_image(path, 16), to_tensor(by_hand, 16))  # and resized after turning


def test_a_pil_image_handed_to_the_captioner_is_turned_too(tmp_path):
    path = tmp_path / "photo.jpg"
    _photo(path, 8)
    with Image.open(path) as opened:
        from_pil = to_image_batch([opened], SIDE)[0]
    assert torch.equal(from_pil, load_image(path, SIDE))
    assert torch.equal(to_image_batch([path], SIDE)[0], from_pil)


def test_an_image_without_the_tag_is_left_as_it_is(tmp_path):
    path = tmp_path / "plain.png"
    _shown().save(path)
    with Image.open(path) as image:
        assert image.getexif().get(EXIF_ORIENTATION) is None
        assert torch.equal(load_image(path, SIDE), to_tensor(image, SIDE))
