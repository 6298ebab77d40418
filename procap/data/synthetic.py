"""Synthetic CLEVR-Change: a small, deterministic, CPU-friendly benchmark in the real on-disk layout.

`generate(out_dir, scenes, size, seed)` writes exactly the CLEVR-Change layout::

    images/CLEVR_default_%06d.png        before
    sc_images/CLEVR_semantic_%06d.png    after, one semantic change (color/material/add/drop/move)
    nsc_images/CLEVR_nonsemantic_%06d.png  distractor: small viewpoint + lighting change only
    change_captions.json, no_change_captions.json   {"CLEVR_default_%06d.png": [captions]}
    splits.json        {"train"|"val"|"test": [int index, ...]}
    type_mapping.json  {type: ["%06d.png", ...]}
    scenes.json        the scene specs, so any change can be re-rendered (`render_intermediate`)

Change types are assigned round-robin by scene index and each type is split separately, so every split
holds every type (given at least 3 scenes per type).

``viewpoint`` sets how the camera and light move between the two images of a pair (:data:`VIEW_JITTER`):

- ``none``: the semantic image keeps the before image's view (only the object changes); the distractor gets a
  small viewpoint and lighting change;
- ``distractor``: the semantic image also gets its own view, drawn like a distractor's, so the amount of changed
  pixels no longer tells a change from a distractor (in CLEVR-Change both kinds of pair are jittered);
- ``strong``: both kinds of pair get larger shifts and zooms.

Under every ``viewpoint`` a share of the distractor pairs (:data:`STILL_SHARE`) is *still*: no camera or light
change at all, so the "after" image is pixel-identical to the before image and a model learns to say "no change"
when nothing changed (without them, every no-change pair of training moves the camera).

Objects, changes, captions and splits do not depend on ``viewpoint`` (the views come from a random stream of
their own), so the three benchmarks of a seed hold the same scenes. The view is interpolated with the object
(:func:`render_state`), so the ground-truth intermediate states stay well defined under any viewpoint.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from procap.core import validate
from procap.core.config import VIEWPOINTS
from procap.core.errors import ProCapError
from procap.core.files import RunFolderLock, atomic_write_json, make_parents, remove_empty, signals_deferred, writing
from procap.core.json_files import read_json
from procap.data.datasets import DATASETS
from procap.data.render import COLORS, MATERIALS, SHAPES, SIZES, DrawItem, View, render_items

logger = logging.getLogger(__name__)

CHANGE_TYPES = DATASETS["clevr-change"].change_types  # the synthetic benchmark writes the CLEVR-Change layout
# Key order of the real type_mapping.json (a permutation of CHANGE_TYPES), so our files read like theirs.
TYPE_MAPPING_ORDER = tuple(CHANGE_TYPES[i] for i in (0, 1, 4, 3, 2))

DEFAULT_NAME = "CLEVR_default_%06d.png"
SEMANTIC_NAME = "CLEVR_semantic_%06d.png"
NONSEMANTIC_NAME = "CLEVR_nonsemantic_%06d.png"
IMAGE_FOLDERS = ("images", "sc_images", "nsc_images")
JSON_FILES = ("change_captions.json", "no_change_captions.json", "splits.json", "type_mapping.json", "scenes.json")
LAYOUT = IMAGE_FOLDERS + JSON_FILES  # everything generate() writes, and so everything it may replace

TEMPLATES: dict[str, tuple[str, ...]] = {
    "color": (
        "the {obj} changed to {new}",
        "the {obj} turned {new}",
        "the {obj} became {new}",
        "the {obj} changed its color",
        "the color of the {obj} changed to {new}",
        "the {obj} was painted {new}",
    ),
    "material": (
        "the {obj} changed to {new}",
        "the {obj} became {new}",
        "the {obj} changed its material",
        "the {obj} is now made of {new}",
        "the material of the {obj} changed to {new}",
    ),
    "add": (
        "the {obj} has been newly placed",
        "someone added a {obj}",
        "a {obj} has been added",
        "there is a new {obj}",
        "a new {obj} appeared",
    ),
    "drop": (
        "the {obj} has disappeared",
        "there is no longer a {obj}",
        "the {obj} is missing",
        "the {obj} is gone",
        "someone removed the {obj}",
    ),
    "move": (
        "the {obj} moved",
        "the {obj} changed its location",
        "the {obj} was moved",
        "the {obj} is in a different location",
        "someone changed the location of the {obj}",
    ),
    "no_change": (
        "no change was made",
        "the scene remains the same",
        "nothing has changed",
        "there is no change",
        "the two scenes seem identical",
        "no change has occurred",
    ),
}
CAPTIONS_PER_IMAGE = 5
MAX_SCENES = 999_999  # the image names hold six digits; 25 times CLEVR-Change's 39,803 scenes
MAX_SIZE = 4096  # image side in pixels
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)

# Ranges of the view jitter: each field moves by a random sign times U(low, high) (scale and brightness about
# 1, light about the before image's azimuth, in radians; dx, dy, as fractions of the image side).
DISTRACTOR_JITTER = {
    "dx": (0.015, 0.035),
    "dy": (0.01, 0.025),
    "scale": (0.02, 0.05),
    "light": (0.3, 0.7),
    "brightness": (0.06, 0.14),
}
# Share of the distractor pairs that keep the before image's view exactly (pixel-identical pairs), drawn per scene
# from a stream of its own so that objects, changes and the other views do not move.
STILL_SHARE = 0.2
STRONG_JITTER = {**DISTRACTOR_JITTER, "dx": (0.03, 0.07), "dy": (0.02, 0.05), "scale": (0.04, 0.10)}
# viewpoint -> (jitter of the semantic after image or None for the before image's view, jitter of the distractor)
VIEW_JITTER: dict[str, tuple[dict[str, tuple[float, float]] | None, dict[str, tuple[float, float]]]] = {
    "none": (None, DISTRACTOR_JITTER),
    "distractor": (DISTRACTOR_JITTER, DISTRACTOR_JITTER),
    "strong": (STRONG_JITTER, STRONG_JITTER),
}


def describe(obj: dict[str, Any]) -> str:
    """'small red metal cube': size, colour, material, shape as CLEVR-Change captions name objects."""
    return f"{obj['size']} {obj['color']} {obj['material']} {obj['shape']}"


# ----------------------------------------------------------------------------------------------- scenes


def _attributes(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    return obj["size"], obj["color"], obj["material"], obj["shape"]


def _fits(x: float, y: float, size: str, others: list[dict[str, Any]]) -> bool:
    # Keep objects apart (some overlap of the pseudo-3D extents is fine, hiding one is not).
    return all(math.hypot(x - o["x"], y - o["y"]) >= 1.15 * (SIZES[size] + SIZES[o["size"]]) for o in others)


def _place(rng: random.Random, size: str, others: list[dict[str, Any]], away_from=None) -> tuple[float, float] | None:
    margin = SIZES[size] + 0.04
    for _ in range(200):
        x, y = rng.uniform(margin, 1 - margin), rng.uniform(margin + 0.04, 1 - margin)
        if away_from is not None and math.hypot(x - away_from[0], y - away_from[1]) < 0.25:
            continue
        if _fits(x, y, size, others):
            return round(x, 4), round(y, 4)
    return None


def _new_object(rng: random.Random, others: list[dict[str, Any]]) -> dict[str, Any] | None:
    taken = {_attributes(o) for o in others}
    for _ in range(50):
        obj: dict[str, Any] = {
            "shape": rng.choice(SHAPES),
            "color": rng.choice(sorted(COLORS)),
            "size": rng.choice(sorted(SIZES)),
            "material": rng.choice(MATERIALS),
        }
        if _attributes(obj) in taken:  # every object must be uniquely described by its caption
            continue
        pos = _place(rng, obj["size"], others)
        if pos is not None:
            obj["x"], obj["y"] = pos
            return obj
    return None


def _change(rng: random.Random, kind: str, objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    target = rng.randrange(len(objects))
    obj = objects[target]
    taken = {_attributes(o) for o in objects}
    if kind == "color":
        options = [c for c in sorted(COLORS) if (obj["size"], c, obj["material"], obj["shape"]) not in taken]
        return {"type": kind, "target": target, "to": rng.choice(options)} if options else None
    if kind == "material":
        new = "metal" if obj["material"] == "rubber" else "rubber"
        if (obj["size"], obj["color"], new, obj["shape"]) in taken:
            return None
        return {"type": kind, "target": target, "to": new}
    if kind == "add":
        added = _new_object(rng, objects)
        return {"type": kind, "object": added} if added else None
    if kind == "drop":
        return {"type": kind, "target": target}
    others = [o for i, o in enumerate(objects) if i != target]
    pos = _place(rng, obj["size"], others, away_from=(obj["x"], obj["y"]))
    return {"type": kind, "target": target, "to": list(pos)} if pos else None


def _jittered_view(rng: random.Random, base: View, jitter: dict[str, tuple[float, float]]) -> View:
    """A view moved from ``base`` by ``jitter``'s ranges (see :data:`DISTRACTOR_JITTER`), rounded to 4 decimals."""
    centres = {"dx": 0.0, "dy": 0.0, "scale": 1.0, "light": base.light, "brightness": 1.0}
    fields = {}
    for name, centre in centres.items():  # this order of draws is the one every benchmark so far was made with
        sign = rng.choice((-1.0, 1.0))
        fields[name] = round(centre + sign * rng.uniform(*jitter[name]), 4)
    return View(**fields)


def check_viewpoint(viewpoint: str) -> None:
    """Raise a one-sentence :class:`ProCapError` unless ``viewpoint`` is one of :data:`VIEWPOINTS`."""
    if viewpoint not in VIEWPOINTS:
        raise ProCapError(f"viewpoint must be one of {', '.join(VIEWPOINTS)}, got {viewpoint!r}.")


def make_scene(index: int, seed: int, kind: str | None = None, viewpoint: str = "none") -> dict[str, Any]:
    """Sample scene `index` (before objects, one change, the views), deterministic in (seed, index, viewpoint).

    The scene holds ``view`` (the before image's), ``distractor_view`` and, unless ``viewpoint`` is ``none``,
    ``after_view`` (the semantic after image's). A still scene (:data:`STILL_SHARE`) has ``distractor_view``
    equal to ``view`` and ``still: true``.
    """
    check_viewpoint(viewpoint)
    kind = kind or CHANGE_TYPES[index % len(CHANGE_TYPES)]
    rng = random.Random(seed * 1_000_003 + index)
    while True:  # rejection: a few scenes cannot host the requested change (e.g. no room to move)
        objects: list[dict[str, Any]] = []
        for _ in range(rng.randint(3, 6)):
            obj = _new_object(rng, objects)
            if obj is not None:
                objects.append(obj)
        change = _change(rng, kind, objects) if len(objects) >= 3 else None
        if change is not None:
            break
    view = View(light=round(-2.3 + rng.uniform(-0.2, 0.2), 4))
    scene: dict[str, Any] = {
        "index": index,
        "objects": objects,
        "change": change,
        "view": vars(view),
        "distractor_view": vars(_jittered_view(rng, view, DISTRACTOR_JITTER)),
    }
    after_jitter, distractor_jitter = VIEW_JITTER[viewpoint]
    if after_jitter is not None:
        # A stream of its own: the objects and changes above stay those of the `none` benchmark of the seed.
        view_rng = random.Random(f"procap-synth-view:{seed}:{index}")
        scene["after_view"] = vars(_jittered_view(view_rng, view, after_jitter))
        if distractor_jitter is not DISTRACTOR_JITTER:
            scene["distractor_view"] = vars(_jittered_view(view_rng, view, distractor_jitter))
    if random.Random(f"procap-synth-still:{seed}:{index}").random() < STILL_SHARE:
        scene["distractor_view"] = dict(scene["view"])
        scene["still"] = True
    return scene


def changed_object(scene: dict[str, Any]) -> dict[str, Any]:
    """The object the caption talks about, with its *before* attributes (the added object for add)."""
    change = scene["change"]
    return change["object"] if change["type"] == "add" else scene["objects"][change["target"]]


def captions_for(scene: dict[str, Any], rng: random.Random, count: int = CAPTIONS_PER_IMAGE) -> list[str]:
    """`count` distinct template captions for the scene's change."""
    change = scene["change"]
    obj, new = describe(changed_object(scene)), change.get("to")
    templates = rng.sample(TEMPLATES[change["type"]], min(count, len(TEMPLATES[change["type"]])))
    return [t.format(obj=obj, new=new) for t in templates]


def no_change_captions(rng: random.Random, count: int = CAPTIONS_PER_IMAGE) -> list[str]:
    return rng.sample(TEMPLATES["no_change"], min(count, len(TEMPLATES["no_change"])))


# ---------------------------------------------------------------------------------------------- drawing


def _item(obj: dict[str, Any], **override: Any) -> DrawItem:
    spec = {**obj, **override}
    rgb = spec.get("rgb", np.asarray(COLORS[spec["color"]], dtype=np.float64))
    metal = spec.get("metal", 1.0 if spec["material"] == "metal" else 0.0)
    return DrawItem(spec["shape"], rgb, SIZES[spec["size"]], metal, spec["x"], spec["y"], spec.get("alpha", 1.0))


def state_items(scene: dict[str, Any], t: float) -> list[DrawItem]:
    """Draw items at time t of the change; linear in t so t=0 / t=1 are exactly before / after."""
    change = scene["change"]
    items = []
    for i, obj in enumerate(scene["objects"]):
        if i != change.get("target"):
            items.append(_item(obj))
            continue
        kind = change["type"]
        if kind == "color":
            c0, c1 = (np.asarray(COLORS[c], dtype=np.float64) for c in (obj["color"], change["to"]))
            items.append(_item(obj, rgb=(1.0 - t) * c0 + t * c1))
        elif kind == "material":
            m1 = 1.0 if change["to"] == "metal" else 0.0
            items.append(_item(obj, metal=(1.0 - t) * (1.0 - m1) + t * m1))
        elif kind == "drop":
            items.append(_item(obj, alpha=1.0 - t))
        elif kind == "move":
            x1, y1 = change["to"]
            items.append(_item(obj, x=(1.0 - t) * obj["x"] + t * x1, y=(1.0 - t) * obj["y"] + t * y1))
    if change["type"] == "add":
        items.append(_item(change["object"], alpha=t))
    return items


def view_at(start: dict[str, float], end: dict[str, float], t: float) -> View:
    """The view a fraction t of the way from ``start`` to ``end``: exactly ``start`` at t = 0, ``end`` at t = 1."""
    return View(**{name: (1.0 - t) * start[name] + t * end[name] for name in start})


def render_state(scene: dict[str, Any], t: float, size: int, distractor: bool = False) -> np.ndarray:
    """Image (size, size, 3) uint8 of the scene at time t of its change pair (t = 0: the before image).

    The change pair moves the object and, when the scene has an ``after_view``, the camera and light with it; the
    distractor pair (``distractor=True``) keeps the objects and moves only the view, to the distractor's at t = 1.
    """
    t = float(t)
    if distractor:
        return render_items(state_items(scene, 0.0), view_at(scene["view"], scene["distractor_view"], t), size)
    if "after_view" not in scene:  # the view stays put: drawn exactly as before viewpoints existed
        return render_items(state_items(scene, t), View(**scene["view"]), size)
    return render_items(state_items(scene, t), view_at(scene["view"], scene["after_view"], t), size)


_SCENES_CACHE: dict[tuple[str, float], dict[str, Any]] = {}


def _read_scenes(root: Path) -> dict[str, Any]:
    path = root / "scenes.json"
    if not path.is_file():
        raise ProCapError(f"{path} does not exist; render_intermediate needs a directory written by `procap synth`.")
    key = (str(path.resolve()), path.stat().st_mtime)
    if key not in _SCENES_CACHE:
        try:
            data = read_json(path, "synthetic scenes file")
            data["by_index"] = {s["index"]: s for s in data["scenes"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise ProCapError(f"{path} is not a valid scenes.json file ({exc}).") from None
        _SCENES_CACHE.clear()
        _SCENES_CACHE[key] = data
    return _SCENES_CACHE[key]


def scene_of(after_name: str) -> tuple[int, bool] | None:
    """(scene index, is the distractor pair) of an after image this module names, or None for another name."""
    match = re.fullmatch(r"CLEVR_(semantic|nonsemantic)_(\d{6,})\.png", after_name)
    return None if match is None else (int(match[2]), match[1] == "nonsemantic")


def render_intermediate(root: str | os.PathLike, index: int, t: float, distractor: bool = False) -> np.ndarray:
    """Ground-truth state of scene `index`'s change at time t in [0, 1] as uint8 (H, W, 3).

    Move interpolates the object's position, color / material blend the two appearances, add / drop
    fade the object in / out; a view change (every distractor, and the change pair of a benchmark made with a
    ``viewpoint`` other than ``none``) is interpolated with it. t = 0 equals the before image and t = 1 the after
    image (the distractor's with ``distractor=True``), pixel for pixel.
    """
    if not 0.0 <= t <= 1.0:
        raise ProCapError(f"t must be in [0, 1], got {t}.")
    data = _read_scenes(Path(root))
    scene = data["by_index"].get(int(index))
    if scene is None:
        raise ProCapError(f"scene {index} is not in {Path(root) / 'scenes.json'}.")
    return render_state(scene, t, int(data["size"]), distractor=distractor)


# --------------------------------------------------------------------------------------------- the layout


def split_indices(types: list[str], seed: int, fractions=SPLIT_FRACTIONS) -> dict[str, list[int]]:
    """Split scene indices per change type so that each split gets every type (>= 3 scenes per type)."""
    rng = random.Random(seed)
    splits: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for kind in CHANGE_TYPES:
        idx = [i for i, k in enumerate(types) if k == kind]
        rng.shuffle(idx)
        n_val = max(1, round(len(idx) * fractions[1])) if len(idx) >= 3 else 0
        n_test = max(1, round(len(idx) * fractions[2])) if len(idx) >= 3 else 0
        splits["val"] += idx[:n_val]
        splits["test"] += idx[n_val : n_val + n_test]
        splits["train"] += idx[n_val + n_test :]
    return {name: sorted(ids) for name, ids in splits.items()}


def _save_png(array: np.ndarray, path: Path) -> None:
    Image.fromarray(array).save(path, compress_level=1)


def _render_scenes(args: tuple[str, list[int], int, int, str]) -> list[tuple[dict, list[str], list[str]]]:
    """Worker: sample, render and save a chunk of scenes; returns (scene, change caps, no-change caps)."""
    out, indices, size, seed, viewpoint = args
    root = Path(out)
    results = []
    for i in indices:
        scene = make_scene(i, seed, viewpoint=viewpoint)
        _save_png(render_state(scene, 0.0, size), root / "images" / (DEFAULT_NAME % i))
        _save_png(render_state(scene, 1.0, size), root / "sc_images" / (SEMANTIC_NAME % i))
        _save_png(render_state(scene, 1.0, size, distractor=True), root / "nsc_images" / (NONSEMANTIC_NAME % i))
        rng = random.Random(seed * 7919 + i)
        results.append((scene, captions_for(scene, rng), no_change_captions(rng)))
    return results


def check_replaceable(root: Path) -> None:
    """Refuse a ``root`` that holds layout entries but no ``scenes.json``.

    Such a folder is not a benchmark this module wrote (a real CLEVR-Change root, say), so nothing in it may be
    replaced.
    """
    present = [root / name for name in LAYOUT if (root / name).exists()]
    if present and not (root / "scenes.json").is_file():
        raise ProCapError(
            f"{root} holds {present[0].name} but no scenes.json, so it is not a synthetic benchmark to replace; "
            "choose another folder."
        )


def generate(
    out_dir: str | os.PathLike,
    scenes: int,
    size: int = 64,
    seed: int = 0,
    workers: int = 1,
    progress: bool = True,
    viewpoint: str = "none",
) -> dict[str, list[int]]:
    """Write a synthetic CLEVR-Change benchmark to `out_dir` (see the module docstring for the layout).

    Args:
        out_dir: target directory (created). A synthetic benchmark already there is replaced whole, so no image
            of a larger earlier one is left behind; files outside the layout are left alone. The new benchmark is
            written beside the old one (in a hidden folder inside `out_dir`) and moved into place only when
            complete, so a failed or interrupted run leaves the old benchmark as it was (and no partial one).
        scenes: number of scenes; each gives a change pair and a distractor pair.
        size: image side in pixels.
        seed: everything (objects, changes, captions, splits) is a function of the seed.
        workers: processes used for rendering; the output does not depend on it.
        progress: show a tqdm progress bar.
        viewpoint: ``none``, ``distractor`` or ``strong``: how the view moves within a pair (module docstring).

    Returns:
        The splits written to splits.json: {"train"|"val"|"test": [scene index, ...]}.
    """
    _check_generate_arguments(scenes, size, seed, workers, viewpoint)
    root = Path(out_dir)
    created: list[Path] = []
    try:
        with writing(root):
            created = make_parents(root / "scenes.json")
        # one generate per folder: a second one's swap would interleave with this one's, and only with the lock
        # held is a staging folder left inside known to be a dead run's
        with RunFolderLock(root, "the benchmark folder"):
            return _replace_benchmark(root, scenes, size, seed, workers, progress, viewpoint)
    except BaseException:
        remove_empty(created)
        raise


def _check_generate_arguments(scenes: int, size: int, seed: int, workers: int, viewpoint: str) -> None:
    """:func:`generate`'s arguments, bounded before anything is allocated: the scene indices are listed up front
    (10**10 scenes took all memory)."""
    validate.integer(scenes, "scenes", minimum=1, maximum=MAX_SCENES)
    validate.integer(size, "size", minimum=16, maximum=MAX_SIZE)
    validate.seed(seed, "seed")
    validate.integer(workers, "workers", minimum=1, maximum=validate.MAX_WORKERS)
    check_viewpoint(viewpoint)


def _replace_benchmark(
    root: Path, scenes: int, size: int, seed: int, workers: int, progress: bool, viewpoint: str
) -> dict[str, list[int]]:
    """Under :func:`generate`'s lock: what a killed run left put right, then the new benchmark written into a
    staging folder inside ``root`` and swapped in. A failed or interrupted one is deleted, so no half-written
    benchmark is left behind, unless its swap could not be undone (the next ``generate`` puts the old entries
    back)."""
    import shutil
    import tempfile

    for note in recover_interrupted_swap(root):
        logger.warning("procap: note: %s.", note)
    check_replaceable(root)
    with writing(root):
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    try:
        splits = _write_benchmark(staging, scenes, size, seed, workers, progress, viewpoint)
        with writing(root):
            _swap_in(staging, root)
    except BaseException:
        if not _swapped_out(staging):
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return splits


STAGING_PREFIX = ".synth-new-"
_REPLACED = ".replaced"  # inside the staging folder: the old benchmark's entries while the swap runs


def _swap_in(staging: Path, root: Path) -> None:
    """Move the complete benchmark in ``staging`` into ``root``, replacing the old one entry by entry.

    Ctrl-C and SIGTERM are deferred while the entries move (a few renames), and an error part-way moves every
    entry back, so the old benchmark is whole until the last rename and the new one after it. The one window left
    is a process killed outright part-way: the old entries then wait in ``staging/.replaced``, and the next
    ``generate`` into ``root`` puts them back first (:func:`recover_interrupted_swap`).
    """
    import shutil

    trash = staging / _REPLACED
    trash.mkdir()
    with signals_deferred():
        try:
            for name in LAYOUT:
                old = root / name
                if old.exists() or old.is_symlink():
                    os.rename(old, trash / name)
                os.rename(staging / name, old)
        except BaseException:
            _move_back(staging, root)
            raise
    shutil.rmtree(staging, ignore_errors=True)


def _move_back(staging: Path, root: Path) -> None:
    """Undo a part-way :func:`_swap_in`: every new entry back into ``staging``, every old one back into ``root``."""
    trash = staging / _REPLACED
    for name in LAYOUT:
        if not (staging / name).exists() and ((root / name).exists() or (root / name).is_symlink()):
            os.rename(root / name, staging / name)  # this entry had been swapped in
        if (trash / name).exists() or (trash / name).is_symlink():
            os.rename(trash / name, root / name)


def _swapped_out(staging: Path) -> bool:
    """Whether ``staging`` still holds entries of the old benchmark (a swap that could not be undone)."""
    trash = staging / _REPLACED
    return trash.is_dir() and any(trash.iterdir())


def recover_interrupted_swap(root: Path) -> list[str]:
    """Clean up what a ``generate`` killed outright left inside ``root``; returns a sentence per staging folder.

    A staging folder holding old entries in ``.replaced`` was killed part-way through its swap: the entries
    already moved are taken out of ``root`` again, so ``root`` holds the old benchmark whole (when every new entry
    had moved, the new one is whole and stays). A staging folder without old entries was killed while rendering
    and is deleted: it stayed inside the dataset for good when it was left alone as possibly a live run's.

    Only for the one writer of ``root`` (:func:`generate` holds its lock): a live run's staging folder looks the
    same.
    """
    import shutil

    if not root.is_dir():
        return []
    notes = []
    for staging in sorted(root.glob(STAGING_PREFIX + "*")):
        if _swapped_out(staging) and any((staging / name).exists() for name in LAYOUT):
            with writing(root):  # killed part-way through the swap: the old benchmark goes back
                _move_back(staging, root)
            notes.append(f"put back the benchmark in {root} that a synth killed while replacing it had moved aside")
        elif not _swapped_out(staging):
            notes.append(f"deleted {staging.name}, the unfinished benchmark of a synth killed while writing it")
        shutil.rmtree(staging, ignore_errors=True)  # (else killed after the last rename: the new one is whole)
    return notes


def _write_benchmark(
    root: Path, scenes: int, size: int, seed: int, workers: int, progress: bool, viewpoint: str
) -> dict:
    from tqdm import tqdm

    with writing(root):
        for sub in IMAGE_FOLDERS:
            (root / sub).mkdir(exist_ok=True)
    chunk = 25
    jobs = [(str(root), list(range(s, min(s + chunk, scenes))), size, seed, viewpoint) for s in range(0, scenes, chunk)]
    bar = tqdm(total=scenes, desc="synth", unit="scene", disable=not progress)
    results = []
    with writing(root):  # a full disk while saving images names the benchmark's folder
        if workers > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for part in pool.map(_render_scenes, jobs):
                    results += part
                    bar.update(len(part))
        else:
            for job in jobs:
                part = _render_scenes(job)
                results += part
                bar.update(len(part))
    bar.close()
    specs = [r[0] for r in results]
    atomic_write_json(root / "change_captions.json", {DEFAULT_NAME % s["index"]: c for s, c, _ in results})
    atomic_write_json(root / "no_change_captions.json", {DEFAULT_NAME % s["index"]: n for s, _, n in results})
    types = [s["change"]["type"] for s in specs]
    splits = split_indices(types, seed)
    atomic_write_json(root / "splits.json", splits)
    mapping = {k: [f"{i:06d}.png" for i, t in enumerate(types) if t == k] for k in TYPE_MAPPING_ORDER}
    atomic_write_json(root / "type_mapping.json", mapping)
    meta = {"version": 1, "size": size, "seed": seed, "viewpoint": viewpoint, "scenes": specs}
    atomic_write_json(root / "scenes.json", meta)
    return splits
