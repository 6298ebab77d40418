"""Turn what a user hands the Captioner (paths, PIL images, numpy arrays, tensors) into one image batch.

One rule for pixel values, whatever the container (PIL, numpy, tensor; HWC or CHW; single or batched): uint8 holds
0-255 and is scaled to [0, 1]; floats must already lie in [0, 1] (0-255 floats are refused with the fix, never
captioned silently); any other dtype is refused.

The preprocessing is training's: RGB, bicubic resize to ``config.image_size``, floats in [0, 1]. Paths go
through :func:`procap.data.load_image` itself; PIL images and uint8 arrays go through the function it applies
to a decoded file (``procap.data.images.to_tensor``), so a PNG on disk and the same image opened by the user
give identical tensors.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from procap.core.errors import ProCapError
from procap.data import load_image
from procap.data.images import require_pixels, to_tensor

ImageLike = str | os.PathLike | Image.Image | np.ndarray | torch.Tensor


def _from_pil(image: Image.Image, size: int, what: str = "PIL image") -> torch.Tensor:
    """PIL image -> (3, size, size) float in [0, 1] through the very function load_image applies to a file."""
    filename = getattr(image, "filename", "")  # only images opened from a file have one (PIL's ImageFile)
    where = f" from {filename}" if filename else ""
    try:
        return to_tensor(image, size, what + where)
    except ValueError as exc:
        raise ProCapError(f"cannot caption a PIL image of mode {image.mode}: {exc}") from None
    except (OSError, SyntaxError) as exc:  # Image.open decodes lazily: a truncated or corrupt file fails here
        raise ProCapError(f"the PIL image{where} could not be decoded ({exc}).") from None


def _from_path(path: Path, size: int) -> torch.Tensor:
    return load_image(path, size)  # ProCapError naming the file when missing or undecodable


def pixel_stats(images: torch.Tensor) -> torch.Tensor:
    """``(all finite, min, max)`` of float pixels as a (3,) fp32 tensor on their device, without a host read.

    Integer or empty images give ``(1, 0, 0)`` (always acceptable). Read it with :func:`raise_for_pixel_stats`, once
    the work that uses the images is queued (the read then waits for results that are needed anyway).
    """
    if images.numel() == 0 or not images.is_floating_point():
        return torch.tensor([1.0, 0.0, 0.0], device=images.device)
    values = images.detach().float()
    return torch.stack([values.isfinite().all().float(), values.amin(), values.amax()])


def raise_for_pixel_stats(stats: Sequence[float], what: str = "images") -> None:
    """Raise for ``(all finite, min, max)`` from :func:`pixel_stats` that float pixels in [0, 1] cannot have.

    Raises:
        ProCapError: naming what was wrong and the fix (0-255 values: divide by 255).
    """
    finite, low, high = stats
    if not finite:
        raise ProCapError(f"{what} hold NaN or infinite values; pass finite pixels in [0, 1].")
    if low < 0.0 or high > 1.0:
        hint = " (divide 0-255 values by 255)" if high > 1.0 else ""
        raise ProCapError(f"float {what} must lie in [0, 1], got values in [{low:g}, {high:g}]{hint}.")


def check_pixels(images: torch.Tensor, what: str = "images") -> None:
    """Float pixels must be finite and in [0, 1]: NaN, Inf or 0-255 values would caption garbage silently.

    One reduction and one host read for the whole batch (the Captioner reads the device-side
    :func:`pixel_stats` after its work instead).

    Raises:
        ProCapError: naming what was wrong and the fix (0-255 values: divide by 255).
    """
    raise_for_pixel_stats(pixel_stats(images).tolist(), what)


def require_values(images: torch.Tensor, what: str = "images") -> None:
    """A tensor on PyTorch's meta device has a shape and no values: the first read of it raised
    ``NotImplementedError: Cannot copy out of meta tensor``.

    Raises:
        ProCapError: naming ``what``.
    """
    if images.is_meta:
        raise ProCapError(
            f"{what} are on the meta device, which holds shapes and no pixel values; pass tensors that hold the images."
        )


def as_float_pixels(images: torch.Tensor, what: str = "images") -> torch.Tensor:
    """Tensor pixels under the module's rule, without reading anything back: uint8 0-255 -> float / 255, float as
    it is (its range is checked on the device with :func:`pixel_stats`), any other dtype refused.

    Raises:
        ProCapError: a tensor without values (:func:`require_values`), an integer or boolean dtype other than uint8.
    """
    require_values(images, what)
    if images.dtype == torch.uint8:
        return images.float().div_(255.0)
    if not images.is_floating_point():
        raise ProCapError(f"{what} must be uint8 (0-255) or float in [0, 1], got dtype {images.dtype}.")
    return images


def to_unit_float(images: torch.Tensor, what: str = "images") -> torch.Tensor:
    """:func:`as_float_pixels` and then the range check at once (one host read): for single images."""
    images = as_float_pixels(images, what)
    if images.dtype != torch.uint8:
        check_pixels(images, what)
    return images


def _from_array(array: np.ndarray, size: int, what: str = "numpy image") -> torch.Tensor:
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    if array.ndim != 3 or array.shape[-1] not in (3, 4):
        raise ProCapError(f"numpy images must be (H, W, 3) or (H, W, 4), got shape {tuple(array.shape)}")
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.floating):
            raise ProCapError(f"numpy images must be uint8 or float in [0, 1], got dtype {array.dtype}")
        check_pixels(torch.from_numpy(np.asarray(array, dtype=np.float32)), "numpy images")
        array = np.clip(np.rint(array * 255.0), 0, 255).astype(np.uint8)
    return _from_pil(Image.fromarray(np.ascontiguousarray(array)), size, what)


def _from_tensor(tensor: torch.Tensor, size: int) -> torch.Tensor:
    require_values(tensor, "image tensors")
    if tensor.dtype == torch.uint8:
        if tensor.ndim == 3 and tensor.shape[0] in (3, 4) and tensor.shape[-1] not in (3, 4):
            tensor = tensor.permute(1, 2, 0)
        return _from_array(tensor.cpu().numpy(), size, "image tensor")
    if tensor.ndim != 3 or tensor.shape[0] != 3:
        raise ProCapError(f"float image tensors must be (3, H, W) in [0, 1], got shape {tuple(tensor.shape)}")
    require_pixels(tensor.shape[2], tensor.shape[1], "image tensor")
    if not tensor.is_floating_point():
        raise ProCapError(f"image tensors must be uint8 or float in [0, 1], got dtype {tensor.dtype}")
    check_pixels(tensor, "image tensors")
    tensor = tensor.float()
    if tensor.shape[-2:] != (size, size):
        # Not bit-identical to PIL's bicubic; pass uint8 / PIL / paths for training's exact preprocessing.
        tensor = F.interpolate(tensor[None], size=(size, size), mode="bicubic", antialias=True, align_corners=False)[
            0
        ].clamp_(0.0, 1.0)
    return tensor


def to_image_tensor(image: ImageLike, size: int) -> torch.Tensor:
    """One image -> (3, size, size) float32 in [0, 1] on the CPU.

    Args:
        image: a path, a PIL image, a numpy array (H, W, 3) uint8 (or float in [0, 1]), a uint8 tensor
            (H, W, 3) / (3, H, W), or a float tensor (3, H, W) in [0, 1].
        size: the model's ``config.image_size``.
    """
    if isinstance(image, (str, os.PathLike)):  # any path object, not only pathlib's
        return _from_path(Path(image), size)
    if isinstance(image, Image.Image):
        return _from_pil(image, size)
    if isinstance(image, np.ndarray):
        return _from_array(image, size)
    if isinstance(image, torch.Tensor):
        return _from_tensor(image.detach(), size)
    raise ProCapError(
        f"cannot caption an image of type {type(image).__name__}; pass a path, PIL image, numpy array or tensor"
    )


def to_image_batch(images: Any, size: int) -> torch.Tensor:
    """A sequence of images, or an already batched float tensor (B, 3, size, size), -> (B, 3, size, size)."""
    if isinstance(images, torch.Tensor) and images.ndim == 4:
        if images.shape[1] == 3 and images.shape[-2:] == (size, size):
            return to_unit_float(images.detach(), "image tensors").float().cpu()
        if images.dtype != torch.uint8:  # uint8 batches of other sizes or HWC go image by image below
            raise ProCapError(f"a batched image tensor must be (B, 3, {size}, {size}), got {tuple(images.shape)}")
    if isinstance(images, (str, os.PathLike, Image.Image)) or (hasattr(images, "ndim") and images.ndim == 3):
        images = [images]  # a single image where a batch was expected
    images = list(images) if isinstance(images, Sequence) or hasattr(images, "__iter__") else [images]
    if not images:
        return torch.empty(0, 3, size, size)
    return torch.stack([to_image_tensor(image, size) for image in images])
