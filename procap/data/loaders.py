"""Loaders for the three real benchmarks (docs/data.md); each returns a list of ``ChangePair``.

They are registered with their other facts in :data:`procap.data.datasets.DATASETS`; call them through
:func:`procap.data.load_split`.

* CLEVR-Change: two pairs per scene, (default, semantic) with a change caption and (default, nonsemantic),
  the distractor, with a no-change caption. Change types come from ``type_mapping.json``.
* Spot-the-Diff: ``annotations/<split>.json``; repeated ``img_id`` entries are merged, empty sentences dropped.
* Image-Editing-Request: ``<split>.json`` with ``valid.json`` as the validation split; mixed image extensions.
* LEVIR-CC: one Karpathy-style ``LevirCCcaptions.json`` for every split, images in ``images/<split>/{A,B}``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from procap.core.errors import ProCapError
from procap.core.json_files import read_json
from procap.core.validate import input_dir
from procap.data.records import ChangePair


def _require_dir(path: Path, what: str) -> Path:
    return input_dir(path, what)


def _require_list(data: Any, path: Path, what: str) -> list:
    if not isinstance(data, list):
        raise ProCapError(f"{what} {path} must hold a JSON list of entries, found {type(data).__name__}.")
    return data


def _is_id(value: object) -> bool:
    """Ids are strings or integers (JSON true/false are not ids, although Python counts bool as int)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _captions(value: object, path: Path, what: str, key: object) -> list[str]:
    """A list of caption strings, stripped, empty ones dropped; anything else is a one-sentence error."""
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ProCapError(f"{what} {path} must give a list of caption strings for {key!r}.")
    return [c.strip() for c in value if c.strip()]


def _index_of(name: object) -> int:
    """Scene index from any CLEVR image name: 'CLEVR_default_000123.png', '000123.png' (type_mapping.json)."""
    return int(Path(str(name)).stem.split("_")[-1])


def _clevr_types(root: Path) -> dict[int, str]:
    path = root / "type_mapping.json"
    mapping = read_json(path, "CLEVR-Change type mapping")
    if not isinstance(mapping, dict) or not all(isinstance(v, list) for v in mapping.values()):
        raise ProCapError(f"CLEVR-Change type mapping {path} must be a JSON object from change type to file names.")
    types: dict[int, str] = {}
    for change_type, names in mapping.items():
        for name in names:
            if not _is_id(name):
                raise ProCapError(f"CLEVR-Change type mapping {path} has a file name of type {type(name).__name__}.")
            try:
                index = _index_of(name)
            except ValueError:
                raise ProCapError(f"CLEVR-Change type mapping {path} has a malformed file name {name!r}.") from None
            if index in types:  # the later type won silently, so the breakdown counted the scene wrongly
                raise ProCapError(
                    f"CLEVR-Change type mapping {path} lists scene {index} twice (under {types[index]!r} and "
                    f"{change_type!r}, the second time as {name!r}); give each scene one change type."
                )
            types[index] = change_type
    return types


def _clevr_captions(path: Path) -> dict[int, list[str]]:
    """Caption file (image name -> captions) re-keyed by scene index, whatever the name's prefix."""
    data = read_json(path, "CLEVR-Change caption file")
    if not isinstance(data, dict):
        raise ProCapError(f"CLEVR-Change caption file {path} must be a JSON object from image name to captions.")
    captions: dict[int, list[str]] = {}
    names_of: dict[int, str] = {}
    for name, caps in data.items():
        try:
            index = _index_of(name)
        except ValueError:
            raise ProCapError(f"CLEVR-Change caption file {path} has a malformed image name {name!r}.") from None
        if not isinstance(caps, list) or not caps or not all(isinstance(c, str) and c.strip() for c in caps):
            raise ProCapError(f"CLEVR-Change caption file {path} must map {name!r} to a non-empty list of captions.")
        if index in captions:  # two names of one scene ('CLEVR_default_000001.png', '000001.png'): one list was lost
            raise ProCapError(
                f"CLEVR-Change caption file {path} names scene {index} twice ({names_of[index]!r} and {name!r}); "
                "give each scene one entry."
            )
        captions[index], names_of[index] = caps, name
    return captions


def load_clevr_change(root: str | os.PathLike, split: str) -> list[ChangePair]:
    """CLEVR-Change: for every scene index of the split, its change pair and its distractor pair."""
    root = _require_dir(Path(root), "CLEVR-Change root")
    splits_path = root / "splits.json"
    splits = read_json(splits_path, "CLEVR-Change splits file")
    if not isinstance(splits, dict) or split not in splits:
        raise ProCapError(f"CLEVR-Change splits file {splits_path} has no {split!r} split.")
    if not isinstance(splits[split], list) or not all(_is_id(i) and isinstance(i, int) for i in splits[split]):
        raise ProCapError(f"CLEVR-Change splits file {splits_path} must list int scene indices under {split!r}.")
    change = _clevr_captions(root / "change_captions.json")
    no_change = _clevr_captions(root / "no_change_captions.json")
    types = _clevr_types(root)
    pairs: list[ChangePair] = []
    missing = 0
    for index in splits[split]:
        if index not in change or index not in no_change or index not in types:
            missing += 1
            continue
        before = root / "images" / f"CLEVR_default_{index:06d}.png"
        semantic, nonsemantic = f"CLEVR_semantic_{index:06d}.png", f"CLEVR_nonsemantic_{index:06d}.png"
        pairs.append(ChangePair(semantic, before, root / "sc_images" / semantic, list(change[index]), types[index]))
        pairs.append(
            ChangePair(nonsemantic, before, root / "nsc_images" / nonsemantic, list(no_change[index]), "no_change")
        )
    if missing:
        warnings.warn(
            f"CLEVR-Change {split}: {missing} scene(s) of splits.json have no captions or change type and were skipped",
            stacklevel=2,
        )
    return pairs


def _image_dir(root: Path, candidates: tuple[str, ...]) -> Path:
    for name in candidates:
        if (root / name).is_dir():
            return root / name
    return root


def load_spot_the_diff(root: str | os.PathLike, split: str) -> list[ChangePair]:
    """Spot-the-Diff: merge entries that repeat an ``img_id``; drop empty sentences and ids left without any."""
    root = _require_dir(Path(root), "Spot-the-Diff root")
    path = root / "annotations" / f"{split}.json"
    if not path.is_file() and (root / f"{split}.json").is_file():  # annotations copied without their folder
        path = root / f"{split}.json"
    entries = _require_list(read_json(path, "Spot-the-Diff annotation file"), path, "Spot-the-Diff annotation file")
    images = _image_dir(root, ("resized_images", "images"))
    merged: dict[str, list[str]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or "img_id" not in entry or not isinstance(entry.get("sentences"), list):
            raise ProCapError(f"Spot-the-Diff annotation file {path} has an entry without img_id/sentences list.")
        if not _is_id(entry["img_id"]):
            raise ProCapError(
                f"Spot-the-Diff annotation file {path} has an img_id of type "
                f"{type(entry['img_id']).__name__}; ids are strings or integers."
            )
        sentences = merged.setdefault(str(entry["img_id"]), [])
        sentences.extend(_captions(entry["sentences"], path, "Spot-the-Diff annotation file", entry["img_id"]))
    return [
        ChangePair(img_id, images / f"{img_id}.png", images / f"{img_id}_2.png", sentences, None)
        for img_id, sentences in merged.items()
        if sentences
    ]


def load_image_editing_request(root: str | os.PathLike, split: str) -> list[ChangePair]:
    """Image-Editing-Request: ``valid.json`` is the validation split; image names keep their own extensions."""
    root = _require_dir(Path(root), "Image-Editing-Request root")
    path = root / f"{'valid' if split == 'val' else split}.json"
    entries = _require_list(
        read_json(path, "Image-Editing-Request annotation file"), path, "Image-Editing-Request annotation file"
    )
    images = _image_dir(root, ("images",))
    pairs = []
    for entry in entries:
        if (
            not isinstance(entry, dict)
            or not {"img0", "img1", "sents", "uid"} <= set(entry)
            or not isinstance(entry["sents"], list)
        ):
            raise ProCapError(f"Image-Editing-Request annotation file {path} has an entry without img0/img1/sents/uid.")
        for field in ("img0", "img1"):
            if not isinstance(entry[field], str) or not entry[field].strip():
                raise ProCapError(
                    f"Image-Editing-Request annotation file {path} has an {field} that is not a file "
                    f"name: {entry[field]!r:.40}."
                )
        if not _is_id(entry["uid"]):
            raise ProCapError(
                f"Image-Editing-Request annotation file {path} has a uid of type "
                f"{type(entry['uid']).__name__}; ids are strings or integers."
            )
        sentences = _captions(entry["sents"], path, "Image-Editing-Request annotation file", entry["uid"])
        if sentences:
            pairs.append(ChangePair(str(entry["uid"]), images / entry["img0"], images / entry["img1"], sentences, None))
    return pairs


def _levir_sentence(sentence: object, path: Path, name: object) -> str:
    """One LEVIR-CC sentence: its ``tokens`` joined (what RSICC trains on), else its ``raw`` text."""
    tokens = sentence.get("tokens") if isinstance(sentence, dict) else None
    if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens):
        return " ".join(tokens).strip()
    if isinstance(sentence, dict) and isinstance(sentence.get("raw"), str):
        return sentence["raw"].strip()
    raise ProCapError(f"LEVIR-CC captions file {path} has a sentence of {name!r} without tokens or raw text.")


def load_levir_cc(root: str | os.PathLike, split: str) -> list[ChangePair]:
    """LEVIR-CC (remote sensing): ``LevirCCcaptions.json`` and ``images/<split>/{A,B}/<filename>``.

    The captions file is Karpathy-style: ``{"images": [{"filepath": split folder, "filename", "split",
    "sentences": [{"tokens", "raw"}, ...], "changeflag": 0 | 1}, ...]}``; A holds the before images, B the after
    ones. As RSICC's preprocessing does, a pair's split is its entry's ``split`` field (not the folder it sits in),
    and ``changeflag`` becomes the pair's ``change_type``: ``"change"`` or ``"no_change"``, the groups of the
    evaluation's breakdown. Pairs are read in file order; the pair id is the file name (``train_000001.png``).
    """
    root = _require_dir(Path(root), "LEVIR-CC root")
    path = root / "LevirCCcaptions.json"
    data = read_json(path, "LEVIR-CC captions file")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ProCapError(f"LEVIR-CC captions file {path} must be a JSON object with an 'images' list.")
    images = _image_dir(root, ("images",))
    pairs = []
    for entry in data["images"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            raise ProCapError(f"LEVIR-CC captions file {path} has an image entry without a filename string.")
        if entry.get("split") != split:
            continue
        name = entry["filename"]
        if not isinstance(entry.get("sentences"), list):
            raise ProCapError(f"LEVIR-CC captions file {path} gives no sentences list for {name!r}.")
        folder = images / str(entry.get("filepath") or split)
        captions = [c for c in (_levir_sentence(s, path, name) for s in entry["sentences"]) if c]
        if captions:
            change = _levir_change(entry.get("changeflag"), path, name)
            pairs.append(ChangePair(name, folder / "A" / name, folder / "B" / name, captions, change))
    return pairs


def _levir_change(flag: object, path: Path, name: object) -> str | None:
    """``"change"`` / ``"no_change"`` from a LEVIR-CC ``changeflag`` (1 / 0), None for an entry without one."""
    if flag is None:
        return None
    if isinstance(flag, bool) or flag not in (0, 1):
        raise ProCapError(f"LEVIR-CC captions file {path} gives {name!r} the changeflag {flag!r}; it must be 0 or 1.")
    return "change" if flag == 1 else "no_change"
