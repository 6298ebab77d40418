"""Loaders for the three real benchmarks, all returning `ChangePair` lists (docs/architecture.md, Data contracts).

On-disk formats (DESIGN.md section 5):

- CLEVR-Change: ``images/CLEVR_default_%06d.png``, ``sc_images/CLEVR_semantic_%06d.png``,
  ``nsc_images/CLEVR_nonsemantic_%06d.png``, ``change_captions.json`` / ``no_change_captions.json``
  (default image name -> captions), ``splits.json`` (int indices), ``type_mapping.json``
  (type -> ``"NNNNNN.png"`` names). Two pairs per scene: the semantic change and the distractor.
- Spot-the-Diff: ``annotations/{train,val,test}.json`` lists of ``{img_id, sentences}``; images
  ``<id>.png`` / ``<id>_2.png`` (in ``resized_images/``, ``images/`` or the root). Ids repeat: merged.
- Image-Editing-Request: ``{train,valid,test}.json`` lists of ``{img0, img1, sents, uid}``; images in
  ``images/`` or the root, with mixed extensions (taken verbatim from the file names).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable

from procap.data.records import ChangePair, read_json
from procap.errors import ProCapError

SPLITS = ("train", "val", "test")
_INDEX = re.compile(r"(\d+)\.\w+$")


def _check_root(root: Path, name: str) -> None:
    if not root.is_dir():
        raise ProCapError(f"{name} root {root} does not exist or is not a directory.")


def _expect(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise ProCapError(f"{path} is malformed: expected {what}.")


def _image_dir(root: Path, candidates: tuple[str, ...]) -> Path:
    """First candidate folder that exists (images are only opened later, by load_image)."""
    for sub in candidates:
        if (root / sub).is_dir():
            return root / sub
    return root / candidates[0] if candidates[0] else root


def _clevr_types(path: Path) -> dict[int, str]:
    mapping = read_json(path, "CLEVR-Change type mapping")
    _expect(isinstance(mapping, dict), path, "a dict from change type to image names")
    types = {}
    for kind, names in mapping.items():
        _expect(isinstance(names, list), path, f"a list of image names for type {kind!r}")
        for name in names:
            match = _INDEX.search(str(name))
            _expect(match is not None, path, f"image names like '000123.png', got {name!r}")
            types[int(match.group(1))] = kind
    return types


def _clevr_captions(path: Path) -> dict[int, list[str]]:
    """Caption file keyed by image name (any CLEVR prefix) -> {scene index: captions}."""
    data = read_json(path, "CLEVR-Change caption file")
    _expect(isinstance(data, dict), path, "a dict from image name to a list of captions")
    out = {}
    for name, caps in data.items():
        match = _INDEX.search(name)
        _expect(match is not None and isinstance(caps, list), path, "image names mapped to lists of captions")
        out[int(match.group(1))] = [str(c) for c in caps]
    return out


def load_clevr_change(root: Path, split: str) -> list[ChangePair]:
    """Both pairs of every scene in `split`: (default, semantic) then (default, nonsemantic)."""
    splits = read_json(root / "splits.json", "CLEVR-Change splits file")
    _expect(isinstance(splits, dict) and isinstance(splits.get(split), list), root / "splits.json",
            f"a dict with a list of indices under {split!r}")
    types = _clevr_types(root / "type_mapping.json")
    change = _clevr_captions(root / "change_captions.json")
    no_change = _clevr_captions(root / "no_change_captions.json")
    pairs, skipped = [], 0
    for raw in splits[split]:
        _expect(isinstance(raw, int) or str(raw).isdigit(), root / "splits.json", f"int indices, got {raw!r}")
        i = int(raw)
        if i not in change or i not in no_change or i not in types:
            skipped += 1
            continue
        before = root / "images" / f"CLEVR_default_{i:06d}.png"
        sem, nsem = f"CLEVR_semantic_{i:06d}.png", f"CLEVR_nonsemantic_{i:06d}.png"
        pairs.append(ChangePair(sem, before, root / "sc_images" / sem, change[i], types[i]))
        pairs.append(ChangePair(nsem, before, root / "nsc_images" / nsem, no_change[i], "no_change"))
    if skipped:
        warnings.warn(f"CLEVR-Change {split}: skipped {skipped} indices without captions or change type", stacklevel=3)
    return pairs


def _annotation_list(path: Path, keys: tuple[str, ...], what: str) -> list[dict[str, Any]]:
    data = read_json(path, f"{what} annotation file")
    _expect(isinstance(data, list), path, "a JSON list of objects")
    for entry in data:
        _expect(isinstance(entry, dict) and all(k in entry for k in keys), path,
                f"every entry to have the keys {', '.join(keys)}")
    return data


def load_spot_the_diff(root: Path, split: str) -> list[ChangePair]:
    """Pairs merged by img_id (first-seen order), empty sentences dropped, ids left with none dropped."""
    path = root / "annotations" / f"{split}.json"
    if not path.is_file() and (root / f"{split}.json").is_file():
        path = root / f"{split}.json"
    entries = _annotation_list(path, ("img_id", "sentences"), "Spot-the-Diff")
    merged: dict[str, list[str]] = {}
    for entry in entries:
        sents = entry["sentences"]
        _expect(isinstance(sents, list), path, "'sentences' to be a list of strings")
        merged.setdefault(str(entry["img_id"]), []).extend(s.strip() for s in sents if str(s).strip())
    images = _image_dir(root, ("resized_images", "images", ""))
    return [ChangePair(i, images / f"{i}.png", images / f"{i}_2.png", caps, None)
            for i, caps in merged.items() if caps]


def load_image_editing_request(root: Path, split: str) -> list[ChangePair]:
    """Pairs of Image-Editing-Request; the validation split is read from valid.json."""
    path = root / f"{'valid' if split == 'val' else split}.json"
    entries = _annotation_list(path, ("img0", "img1", "sents", "uid"), "Image-Editing-Request")
    images = _image_dir(root, ("images", ""))
    pairs = []
    for entry in entries:
        _expect(isinstance(entry["sents"], list), path, "'sents' to be a list of strings")
        caps = [s.strip() for s in entry["sents"] if str(s).strip()]
        if caps:
            pairs.append(ChangePair(str(entry["uid"]), images / entry["img0"], images / entry["img1"], caps, None))
    return pairs


LOADERS: dict[str, Callable[[Path, str], list[ChangePair]]] = {
    "clevr-change": load_clevr_change,
    "spot-the-diff": load_spot_the_diff,
    "image-editing-request": load_image_editing_request,
}


def load_split(name: str, root: str | os.PathLike, split: str) -> list[ChangePair]:
    """Load one split of a benchmark.

    Args:
        name: ``clevr-change``, ``spot-the-diff`` or ``image-editing-request``.
        root: the dataset's root directory.
        split: ``train``, ``val`` or ``test`` (``val`` reads Image-Editing-Request's ``valid.json``).

    Returns:
        The split's `ChangePair` records, in file order.

    Raises:
        ProCapError: unknown name or split, missing root or annotation file, malformed annotations.
    """
    if name not in LOADERS:
        raise ProCapError(f"unknown dataset {name!r}; choose one of {', '.join(LOADERS)}.")
    if split not in SPLITS:
        raise ProCapError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    root = Path(root)
    _check_root(root, name)
    return LOADERS[name](root, split)
