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
:class:`~procap.core.errors.OutOfDomainWarning`; :class:`procap.fast.Captioner` gives it once. It names the pairs
that are far (the first :data:`SHOWN_PAIRS` of them, and how many more), each with its sizes or camera, so that a
folder of mixed images says which pairs to look at rather than one size.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
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
SHOWN_PAIRS = 3  # the warning names this many far pairs, then says how many more there are
_EXIF_MAKE, _EXIF_MODEL = 0x010F, 0x0110

Size = tuple[int, int]
ImageFacts = tuple[Size | None, str | None]  # ((width, height), camera) of one input, None for what cannot be told


@dataclass(frozen=True)
class PairFacts:
    """What the rule sees of one (before, after) pair, and how a message names it."""

    name: str | None  # ``before.png -> after.png`` for files; None for images given as pixels
    before: ImageFacts
    after: ImageFacts


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
    make, model = (str(exif.get(tag, "")).strip("\x00 ") for tag in (_EXIF_MAKE, _EXIF_MODEL))
    return camera_name(make, model)


def camera_name(make: str, model: str) -> str | None:
    """``Canon`` + ``EOS 5D`` -> ``Canon EOS 5D``; a model that already names its maker (``Canon`` + ``Canon EOS
    5D``, ``NIKON CORPORATION`` + ``NIKON D750``) is written alone, so that the make is not said twice."""
    if make and model and model.split()[0].casefold() == make.split()[0].casefold():
        return model
    return " ".join(word for word in (make, model) if word) or None


def image_facts(image: Any) -> ImageFacts:
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


def batch_facts(images: Any) -> list[ImageFacts]:
    """:func:`image_facts` of each image of a Captioner argument (one image, a sequence, or a (B, 3, H, W) batch)."""
    if isinstance(images, torch.Tensor) and images.ndim == 4:
        height, width = (images.shape[1], images.shape[2]) if images.shape[-1] in (3, 4) else images.shape[-2:]
        return [((int(width), int(height)), None)] * int(images.shape[0])
    if isinstance(images, (str, os.PathLike, Image.Image)) or (hasattr(images, "ndim") and images.ndim in (2, 3)):
        return [image_facts(images)]
    if isinstance(images, Sequence):  # an iterator is left alone: reading it here would leave nothing to caption
        return [image_facts(image) for image in images]
    return []


def _file_names(images: Any) -> list[str | None]:
    """The path of each image of a Captioner argument as given, None for one given as pixels (or an iterator)."""
    if isinstance(images, (str, os.PathLike)):
        return [os.fspath(images)]
    if isinstance(images, Sequence) and not isinstance(images, str):
        return [os.fspath(image) if isinstance(image, (str, os.PathLike)) else None for image in images]
    return []


def pair_facts(befores: Any, afters: Any) -> list[PairFacts]:
    """:class:`PairFacts` of each pair of a Captioner call (``befores[i]`` -> ``afters[i]``), named by their paths
    where both are files. Unequal counts are left to loading, which refuses them: only whole pairs are returned."""
    before_facts, after_facts = batch_facts(befores), batch_facts(afters)
    before_names, after_names = _file_names(befores), _file_names(afters)
    pairs = []
    for index, (before, after) in enumerate(zip(before_facts, after_facts)):
        names = (before_names[index : index + 1] or [None])[0], (after_names[index : index + 1] or [None])[0]
        name = f"{names[0]} -> {names[1]}" if None not in names else None
        pairs.append(PairFacts(name, before, after))
    return pairs


# ----------------------------------------------------------------------------------------------- the rule
def _far(size: Size | None, references: Sequence[Size]) -> bool:
    """Whether ``size`` is far from every reference size (one side more than :data:`SIZE_FACTOR` off)."""
    # an image without pixels has no ratio to the training size: loading it refuses it, naming it
    if not size or min(size) <= 0 or not references:
        return False
    return all(any(max(a / b, b / a) > SIZE_FACTOR for a, b in zip(size, reference)) for reference in references)


@dataclass(frozen=True)
class _FarPair:
    """A pair the rule flags: its number in the call (from 1), its name, why, and its far sizes."""

    number: int
    name: str | None
    reasons: tuple[str, ...]
    sizes: tuple[Size, ...]


def _far_pair(number: int, pair: PairFacts, synthetic: bool, references: Sequence[Size]) -> _FarPair | None:
    """Why one pair is far from the training domain (a camera, a far size), None when it is not."""
    reasons: list[str] = []
    sizes: list[Size] = []
    for size, camera in (pair.before, pair.after):
        if synthetic and camera:
            reason = f"taken with {'an' if camera[0] in 'AEIOUaeiou' else 'a'} {camera}"  # a photograph
        elif size is not None and _far(size, references):
            reason = f"{size[0]} x {size[1]} px"
            sizes.append(size)
        else:
            continue
        if reason not in reasons:
            reasons.append(reason)
    return _FarPair(number, pair.name, tuple(reasons), tuple(sizes)) if reasons else None


def domain_problem(record: dict[str, Any] | None, pairs: Sequence[PairFacts]) -> str | None:
    """One sentence naming the pairs that are far from the training domain (the module's rule), else None.

    One pair given is named with why (``the pair a.png -> b.png (640 x 480 px) is far ...``); of several, the first
    :data:`SHOWN_PAIRS` far ones are named with theirs, then how many more, and far images of several sizes are
    said to be so (with the smallest and the largest) rather than one size standing for all.
    """
    if not record:
        return None
    source = record.get("source_image_size")
    side = record.get("image_size")
    references: list[Size] = [(source[0], source[1])] if source else []
    if references and side:
        references.append((side, side))
    synthetic = record.get("synthetic") is True
    flagged = [far for number, pair in enumerate(pairs, 1) if (far := _far_pair(number, pair, synthetic, references))]
    if not flagged:
        return None
    trained = f"far from what this model was trained on ({describe_domain(record)})"
    readme = "(README: Caption your own images)"
    if len(pairs) == 1:
        named = f"the pair {flagged[0].name}" if flagged[0].name else "the pair given"
        reasons = ", ".join(flagged[0].reasons)
        return f"{named} ({reasons}) is {trained}; its caption is a guess, not a description {readme}."
    listed = ", ".join(
        f"{far.name or f'pair {far.number}'} ({', '.join(far.reasons)})" for far in flagged[:SHOWN_PAIRS]
    )
    more = f" and {len(flagged) - SHOWN_PAIRS} more" if len(flagged) > SHOWN_PAIRS else ""
    sizes = sorted({size for far in flagged for size in far.sizes}, key=lambda size: (size[0] * size[1], size))
    mixed = ""
    if len(sizes) > 1:
        (small_w, small_h), (large_w, large_h) = sizes[0], sizes[-1]
        mixed = f", with images of {len(sizes)} sizes from {small_w} x {small_h} to {large_w} x {large_h} px"
    return (
        f"{len(flagged)} of the {len(pairs)} pairs are {trained}{mixed}: {listed}{more}; their captions are "
        f"guesses, not descriptions {readme}."
    )
