"""Small on-disk fixtures in the real benchmarks' formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image


def write_image(path: Path, seed: int, size: int = 24, fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format=fmt)


def make_spot(root: Path) -> Path:
    entries = {
        "train": [
            {"img_id": "1", "sentences": ["the car is gone", ""]},
            {"img_id": "2", "sentences": [""]},
            {"img_id": "1", "sentences": ["a person appeared"]},
        ],
        "val": [{"img_id": "7", "sentences": ["nothing"]}],
        "test": [{"img_id": "9", "sentences": ["the truck moved", "a truck left"]}],
    }
    (root / "annotations").mkdir(parents=True)
    for split, data in entries.items():
        (root / "annotations" / f"{split}.json").write_text(json.dumps(data))
    return root


def make_edit(root: Path) -> Path:
    entries = {
        "train": [{"img0": "a.jpg", "img1": "b.PNG", "sents": ["Make it brighter."], "uid": "Reddit_1"}],
        "valid": [
            {"img0": "c.gif", "img1": "d.jpeg", "sents": ["remove the dog", "delete dog", "no dog"], "uid": "Zhopped_2"}
        ],
        "test": [{"img0": "a.jpg", "img1": "e.JPG", "sents": ["crop", "Crop it", "crop the edges"], "uid": "Reddit_3"}],
    }
    root.mkdir(parents=True, exist_ok=True)
    for split, data in entries.items():
        (root / f"{split}.json").write_text(json.dumps(data))
    return root
