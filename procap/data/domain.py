"""What a model was trained on, and whether the images it is asked to caption are far from it.

A checkpoint records its training domain under ``trained_on`` in its ``extra`` metadata (written by ``procap
train`` / ``pretrain`` / the demo, ``procap convert --dataset``, and kept by ``save_pretrained``):

- ``dataset``: the loader's name (``clevr-change``, ``levir-cc``, ...) or None when not known;
- ``synthetic``: True for a benchmark written by ``procap synth`` (its folder holds ``scenes.json``), False for the
  real benchmark, None when not known;
- ``title``: how people call it (``synthetic CLEVR-Change (procap synth)``, ``CLEVR-Change``, ``LEVIR-CC``);
- ``data``: the dataset folder it was read from (absolute), or None;
- ``image_size``: the model's input side in pixels (every image is resized to it);
- ``source_image_size``: ``[width, height]`` of the training images before that resize, or None;
- ``preset``: the model preset's name, or None.

**The rule** (:func:`domain_problem`). With no ``trained_on`` record, or a record that knows neither the training
images' size nor whether they were synthetic, nothing is said. Otherwise an image is out of domain when

1. its size (before the resize) is far from both the training images' size and the model's input size: one side
   more than :data:`SIZE_FACTOR` times larger or smaller than theirs (a 64 px synthetic model given a 640 x 480
   photograph; a 224 px CLEVR-Change model given 480 x 320 or 224 x 224 frames is in domain), or
2. the model was trained on synthetic scenes and the image file's EXIF names a camera (a photograph).

The check sees sizes and EXIF only: a photograph already resized to the training size, with its EXIF stripped,
passes unnoticed. Identical before and after images are legal input and never warned about. The warning is an
:class:`~procap.core.errors.OutOfDomainWarning`; :class:`procap.fast.Captioner` gives it once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from procap.core.errors import ProCapError
from procap.data.datasets import DATASETS
from procap.data.images import open_image

TRAINED_ON = "trained_on"  # the key of the record in a checkpoint's ``extra`` metadata
SIZE_FACTOR = 2.0  # a side this many times larger or smaller than the training images' is far from them
SYNTHETIC_MARK = "scenes.json"  # what `procap synth` writes into every benchmark folder
_EXIF_MAKE, _EXIF_MODEL = 0x010F, 0x0110

Size = tuple[int, int]


def is_synthetic_folder(folder: str | os.PathLike) -> bool:
    """True for a benchmark folder written by ``procap synth`` (it holds ``scenes.json``)."""
    return (Path(folder) / SYNTHETIC_MARK).is_file()


def dataset_title(dataset: str | None, synthetic: bool | None) -> str:
    """How people call the training data: ``synthetic CLEVR-Change (procap synth)``, ``LEVIR-CC``, ``unknown``."""
    spec = DATASETS.get(dataset) if dataset else None
    name = spec.title if spec else (dataset or "")
    if synthetic:
        return f"synthetic {name} (procap synth)" if name else "synthetic scenes (procap synth)"
    return name or "unknown"


def domain_record(
    *,
    dataset: str | None = None,
    synthetic: bool | None = None,
    data: str | os.PathLike | None = None,
    image_size: int | None = None,
    source_image_size: Sequence[int] | None = None,
    preset: str | None = None,
) -> dict[str, Any]:
    """The ``trained_on`` record (the fields of this module's docstring), JSON-ready."""
    return {
        "dataset": dataset,
        "synthetic": synthetic,
        "title": dataset_title(dataset, synthetic),
        "data": None if data is None else os.path.normpath(os.path.abspath(data)),
        "image_size": None if image_size is None else int(image_size),
        "source_image_size": None if source_image_size is None else [int(v) for v in source_image_size],
        "preset": preset,
    }


def file_size(path: str | os.PathLike) -> Size | None:
    """``(width, height)`` of an image file from its header, or None when it cannot be read."""
    try:
        with open_image(path) as image:
            return image.size
    except ProCapError:
        return None


def training_domain(
    dataset: str | None,
    pairs: Sequence[Any],
    image_size: int,
    preset: str | None,
    data: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """The record of a training run on ``pairs`` (:class:`~procap.data.ChangePair`) of ``dataset`` in ``data``.

    Without ``data`` (the demo hands its pairs over), a synthetic benchmark is found from the first before image
    (``<root>/images/<name>``); the training images' size is read from that image's header.
    """
    first = Path(pairs[0].before_path) if pairs else None
    root = Path(data) if data is not None else None
    if root is None and first is not None and is_synthetic_folder(first.parent.parent):
        root = first.parent.parent
    synthetic = None if root is None else is_synthetic_folder(root)
    return domain_record(
        dataset=dataset,
        synthetic=synthetic,
        data=root,
        image_size=image_size,
        source_image_size=file_size(first) if first is not None else None,
        preset=preset,
    )


def read_domain(extra: Any) -> dict[str, Any] | None:
    """The ``trained_on`` record of a checkpoint's decoded ``extra`` metadata, None when it has none.

    Fields of the wrong type are read as unknown, so a hand-edited record can only make the check say less.
    """
    record = extra.get(TRAINED_ON) if isinstance(extra, dict) else None
    if not isinstance(record, dict):
        return None

    def positive(value: Any) -> int | None:
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    source = record.get("source_image_size")
    sides = [positive(v) for v in source] if isinstance(source, list) and len(source) == 2 else [None]
    dataset = record.get("dataset") if isinstance(record.get("dataset"), str) else None
    synthetic = record.get("synthetic") if isinstance(record.get("synthetic"), bool) else None
    return {
        "dataset": dataset,
        "synthetic": synthetic,
        "title": record["title"] if isinstance(record.get("title"), str) else dataset_title(dataset, synthetic),
        "data": record.get("data") if isinstance(record.get("data"), str) else None,
        "image_size": positive(record.get("image_size")),
        "source_image_size": sides if None not in sides else None,
        "preset": record.get("preset") if isinstance(record.get("preset"), str) else None,
    }


def describe_domain(record: dict[str, Any] | None) -> str:
    """One line on a record: ``synthetic CLEVR-Change (procap synth), 64 x 64 px images, model input 64 px, preset
    tiny``; ``unknown`` without one."""
    if not record:
        return "unknown"
    parts = [record.get("title") or "unknown data"]
    if record.get("source_image_size"):
        parts.append("{} x {} px images".format(*record["source_image_size"]))
    if record.get("image_size"):
        parts.append(f"model input {record['image_size']} px")
    if record.get("preset"):
        parts.append(f"preset {record['preset']}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------- input facts
def _camera(image: Image.Image) -> str | None:
    """The camera an image's EXIF names (``Canon EOS 5D``), or None."""
    try:
        exif = image.getexif()
    except (OSError, ValueError, SyntaxError):
        return None
    words = [str(exif.get(tag, "")).strip("\x00 ") for tag in (_EXIF_MAKE, _EXIF_MODEL)]
    return " ".join(w for w in words if w) or None


def image_facts(image: Any) -> tuple[Size | None, str | None]:
    """``((width, height), camera)`` of one input as given, before any resize; None for what cannot be told.

    Takes what the Captioner takes: a path (its header is read, never the pixels), a PIL image, a numpy array
    (H, W[, C]), or a tensor ((3, H, W), (H, W, 3) uint8).
    """
    if isinstance(image, (str, os.PathLike)):
        try:
            with open_image(image) as opened:
                return opened.size, _camera(opened)
        except ProCapError:
            return None, None  # loading the image says what is wrong with it
    if isinstance(image, Image.Image):
        return image.size, _camera(image)
    if isinstance(image, (np.ndarray, torch.Tensor)) and image.ndim in (2, 3):
        shape = tuple(image.shape)
        if image.ndim == 3 and shape[0] in (3, 4) and shape[-1] not in (3, 4):
            return (int(shape[2]), int(shape[1])), None  # channels first
        return (int(shape[1]), int(shape[0])), None
    return None, None


def batch_facts(images: Any) -> list[tuple[Size | None, str | None]]:
    """:func:`image_facts` of each image of a Captioner argument (one image, a sequence, or a (B, 3, H, W) batch)."""
    if isinstance(images, torch.Tensor) and images.ndim == 4:
        height, width = (images.shape[1], images.shape[2]) if images.shape[-1] in (3, 4) else images.shape[-2:]
        return [((int(width), int(height)), None)] * int(images.shape[0])
    if isinstance(images, (str, os.PathLike, Image.Image)) or (hasattr(images, "ndim") and images.ndim in (2, 3)):
        return [image_facts(images)]
    if isinstance(images, Sequence):  # an iterator is left alone: reading it here would leave nothing to caption
        return [image_facts(image) for image in images]
    return []


# ----------------------------------------------------------------------------------------------- the rule
def _far(size: Size, reference: Size) -> bool:
    return any(max(a / b, b / a) > SIZE_FACTOR for a, b in zip(size, reference))


def domain_problem(record: dict[str, Any] | None, facts: Sequence[tuple[Size | None, str | None]]) -> str | None:
    """One sentence on the first input that is far from the training domain (the module's rule), else None."""
    if not record:
        return None
    source = record.get("source_image_size")
    side = record.get("image_size")
    references = [tuple(source)] if source else []
    if references and side:
        references.append((side, side))
    synthetic = record.get("synthetic") is True
    trained = describe_domain(record)
    for size, camera in facts:
        if synthetic and camera:
            return (
                f"an image taken by a camera ({camera}) was given to a model trained on synthetic scenes ({trained}); "
                "its captions of photographs are guesses, not descriptions (README: Caption your own images)."
            )
        # an image without pixels has no ratio to the training size: loading it refuses it, naming it
        if size and min(size) > 0 and references and all(_far(size, reference) for reference in references):
            return (
                f"images of {size[0]} x {size[1]} px are far from what this model was trained on ({trained}); "
                "its captions of them are guesses, not descriptions (README: Caption your own images)."
            )
    return None
