"""Image loading: the one preprocessing shared by training, evaluation, procedures and ``procap.fast``."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from procap.core.errors import ProCapError
from procap.core.validate import input_file

# Pillow guards against decompression bombs (about 89.5 M pixels, ~9459 x 9459 by default); this variable overrides it.
MAX_PIXELS_ENV = "PROCAP_MAX_IMAGE_PIXELS"
# Pillow modes holding one integer channel of more than 8 bits: 16-bit PNGs open as I;16 (or I in older Pillow).
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_PILLOW_DEFAULT_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
_PILLOW_LIMIT_LOCK = threading.Lock()
EXIF_ORIENTATION = 0x0112  # the EXIF tag saying how the stored pixels are turned to be shown upright


def max_image_pixels() -> int:
    """The largest image (width x height) that is decoded: ``$PROCAP_MAX_IMAGE_PIXELS`` or Pillow's default."""
    value = os.environ.get(MAX_PIXELS_ENV)
    if value is None:
        return _PILLOW_DEFAULT_PIXELS
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit <= 0:
        raise ProCapError(f"{MAX_PIXELS_ENV} must be a positive number of pixels, got {value!r}.")
    return limit


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit grey images scaled to 8 bits by their depth (0..65535 -> 0..255); other modes unchanged.

    ``Image.convert("RGB")`` would clip a 16-bit image at 255 instead, turning almost every pixel white.
    """
    if image.mode in _SIXTEEN_BIT_MODES:
        values = np.asarray(image).astype(np.float64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ValueError(f"a {image.mode} image with values outside 0..65535 is not a 16-bit image")
        return Image.fromarray(np.rint(values / 257.0).astype(np.uint8), mode="L")
    if image.mode == "F":
        raise ValueError("floating-point (mode F) images have no defined range; save it as an 8- or 16-bit image")
    return image


def require_pixels(width: int, height: int, what: str = "image") -> None:
    """An image with no pixels (0 x N) would be resized into a blank frame and captioned: refuse it.

    Raises:
        ProCapError: naming the size.
    """
    if width < 1 or height < 1:
        raise ProCapError(f"the {what} is {width} x {height} pixels; an image to caption needs at least one pixel.")


def upright(image: Image.Image) -> Image.Image:
    """``image`` as it is shown: rotated and mirrored by its EXIF orientation tag (a phone stores the sensor's
    pixels and says in the tag how to turn them), unchanged when the tag is absent or 1 (already upright)."""
    if image.getexif().get(EXIF_ORIENTATION, 1) == 1:
        return image
    return ImageOps.exif_transpose(image)


def to_tensor(image: Image.Image, size: int, what: str = "image") -> torch.Tensor:
    """PIL image -> (3, size, size) float32 in [0, 1]: upright (:func:`upright`), RGB, bicubic resize (skipped when
    already that size).

    16-bit images are scaled by their bit depth first. ``what`` names the image in messages (``"image a.png"``).

    Raises:
        ValueError: a floating-point image, or an integer image that is not 16-bit.
        ProCapError: an image without pixels.
    """
    require_pixels(image.width, image.height, what)
    image = _to_8bit(upright(image)).convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BICUBIC)
    array = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)


@contextlib.contextmanager
def open_image(path: str | os.PathLike) -> Iterator[Image.Image]:
    """``Image.open`` with the pixel limit of :func:`max_image_pixels` and one-sentence errors naming the file.

    Raises:
        ProCapError: the file is missing, a directory, larger than the limit or not an image.
    """
    path = input_file(path, "image")
    limit = max_image_pixels()
    try:
        with warnings.catch_warnings():
            # Pillow warns above its limit and refuses at twice it; both become one error at the limit here.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with _PILLOW_LIMIT_LOCK:  # Pillow reads its limit from a global: set it for this open only
                previous, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, limit
                try:
                    image = Image.open(path)
                finally:
                    Image.MAX_IMAGE_PIXELS = previous
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ProCapError(
            f"image {path} has more than {limit:,} pixels, the decoding limit against "
            f"decompression bombs; set {MAX_PIXELS_ENV} to a larger number to read it."
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise ProCapError(f"image {path} could not be read ({exc}).") from None
    with image:
        yield image


def load_image(path: str | os.PathLike, size: int) -> torch.Tensor:
    """Read an image file (png, jpg, gif, ...) as a (3, size, size) float tensor in [0, 1].

    Raises:
        ProCapError: naming the file when it is missing, too large (see :func:`max_image_pixels`) or cannot be
            decoded.
    """
    path = Path(path)
    with open_image(path) as image:
        try:
            image.seek(0)  # first frame of an animated gif
            return to_tensor(image, size, f"image {path}")
        except (OSError, ValueError, SyntaxError) as exc:
            raise ProCapError(f"image {path} could not be read ({exc}).") from None


class ImageCache:
    """``load_image`` with an optional in-memory cache keyed by (path, size).

    Args:
        size: square side the images are resized to.
        enabled: keep decoded images in memory (use for datasets that fit: 64 px images cost 48 KiB each).
    """

    def __init__(self, size: int, enabled: bool = True) -> None:
        self.size, self.enabled = size, enabled
        self._images: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def __call__(self, path: str | os.PathLike) -> torch.Tensor:
        """(3, size, size) float32 in [0, 1]."""
        key = os.fsdecode(path)  # any path object: its str may be a repr, different for each object
        image = self._images.get(key)
        if image is None:
            image = load_image(path, self.size)
            if self.enabled:
                with self._lock:
                    self._images[key] = image
        return image

    def __len__(self) -> int:
        return len(self._images)
