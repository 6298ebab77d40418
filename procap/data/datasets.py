"""The dataset registry: every per-dataset fact in one place (docs/data.md; the authors' configs).

Each :class:`DatasetSpec` names its loader, the HDF5 files of its procedure cache (the authors' names), its
vocabulary threshold, its stage-2 encoder learning rate and its change types. Commands take
``choices=sorted(DATASETS)`` and read the facts from here; nothing else in the package names them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from procap.core.errors import ProCapError
from procap.data.loaders import load_clevr_change, load_image_editing_request, load_levir_cc, load_spot_the_diff
from procap.data.records import ChangePair

SPLITS = ("train", "val", "test")
_CLEVR_ID = re.compile(r"^CLEVR_(semantic|nonsemantic)_(\d+)\.png$")


@dataclass(frozen=True)
class DatasetSpec:
    """Facts about one benchmark.

    Attributes:
        name: the CLI name (``--dataset``).
        title: the benchmark's usual spelling, for messages.
        loader: ``loader(root, split) -> list[ChangePair]`` for split ``train``/``val``/``test``.
        cache_groups: HDF5 files (``<group>.h5``) of its procedure cache, named as the authors name them.
        min_count: vocabulary threshold: words seen fewer times in the training captions become [UNK].
        encoder_lr: the paper's stage-2 encoder learning rate.
        change_types: the change types its pairs carry (empty when the benchmark has none).
        nested_scores: its similarity score file nests entries under ``<group prefix>_sim_matrixes``.
        paper_preset: the model preset trained on it in the paper (``procap.core.config.PRESETS``); training from
            scratch without ``--preset`` uses it.
        source_image_size: ``(width, height)`` of its images as published, when they all share one (None when
            they vary); ``procap convert --dataset`` records it for the out-of-domain check
            (:mod:`procap.data.domain`), where training reads it from the images themselves.
    """

    name: str
    title: str
    loader: Callable[[str | os.PathLike, str], list[ChangePair]]
    cache_groups: tuple[str, ...]
    min_count: int
    encoder_lr: float
    change_types: tuple[str, ...] = ()
    nested_scores: bool = False
    paper_preset: str = "clevr"
    source_image_size: tuple[int, int] | None = None


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        # The authors' vocabularies: every CLEVR-Change word; words seen 4+ times on Spot-the-Diff and on
        # Image-Editing-Request (the released vocabularies: 826 and 516 words). Encoder lr (mmvid configs): 2e-5 on spot.
        DatasetSpec(
            "clevr-change",
            "CLEVR-Change",
            load_clevr_change,
            cache_groups=("sc_videos", "nsc_videos"),
            min_count=1,
            encoder_lr=5e-5,
            change_types=("color", "material", "add", "drop", "move"),
            nested_scores=True,
            source_image_size=(480, 320),  # CLEVR's renderer size
        ),
        DatasetSpec(
            "spot-the-diff",
            "Spot-the-Diff",
            load_spot_the_diff,
            ("spot_videos",),
            min_count=4,
            encoder_lr=2e-5,
            paper_preset="spot",
        ),
        DatasetSpec(
            "image-editing-request",
            "Image-Editing-Request",
            load_image_editing_request,
            ("edit_videos",),
            min_count=4,
            encoder_lr=5e-5,
            paper_preset="edit",
        ),
        # Remote sensing, not in the paper. RSICC's preprocessing keeps words seen more than 5 times (min_count 6);
        # the encoder lr is CLEVR-Change's.
        DatasetSpec(
            "levir-cc",
            "LEVIR-CC",
            load_levir_cc,
            ("levir_videos",),
            min_count=6,
            encoder_lr=5e-5,
            paper_preset="levir",
            source_image_size=(256, 256),
        ),
    )
}
DEFAULT_DATASET = "clevr-change"


def get_dataset(name: str) -> DatasetSpec:
    """The spec registered as ``name``; an unknown name is a one-sentence :class:`ProCapError`."""
    if name not in DATASETS:
        raise ProCapError(f"unknown dataset {name!r}; choose one of: {', '.join(sorted(DATASETS))}.")
    return DATASETS[name]


def load_split(name: str, root: str | os.PathLike, split: str) -> list[ChangePair]:
    """Load one split of a benchmark.

    Args:
        name: a :data:`DATASETS` name (``clevr-change``, ``spot-the-diff``, ``image-editing-request``).
        root: the dataset's root folder (the layout of docs/data.md).
        split: ``train``, ``val`` or ``test`` (``valid`` is accepted as ``val``).

    Returns:
        The split's pairs in file order.

    Raises:
        ProCapError: among others, when the split lists a pair twice (a scene index repeated in
            ``splits.json``, a ``uid`` in two entries): it would be trained on and scored twice.
    """
    spec = get_dataset(name)
    split = "val" if split == "valid" else split
    if split not in SPLITS:
        raise ProCapError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}.")
    pairs = spec.loader(root, split)
    seen: set[str] = set()
    for pair in pairs:
        if pair.id in seen:
            raise ProCapError(f"the {split} split of {spec.title} in {root} lists pair {pair.id} twice.")
        seen.add(pair.id)
    return pairs


def cache_key(pair_id: str, dataset: str | None = None) -> tuple[str, str]:
    """Map one of our pair ids to the authors' (cache group, HDF5 key).

    ``CLEVR_semantic_000123.png`` -> (``sc_videos``, ``000123.png``), ``CLEVR_nonsemantic_...`` -> ``nsc_videos``
    (whatever ``dataset`` says); otherwise the dataset's single group, or ``videos`` for unknown datasets. Keys are
    HDF5 names, so they may not contain ``/``.
    """
    match = _CLEVR_ID.match(pair_id)
    if match:
        change, distractor = DATASETS["clevr-change"].cache_groups
        return (change if match.group(1) == "semantic" else distractor), f"{match.group(2)}.png"
    if "/" in pair_id:
        raise ProCapError(f"pair id {pair_id!r} contains '/', which cannot be an HDF5 dataset name.")
    groups = DATASETS[dataset].cache_groups if dataset in DATASETS else ()
    return (groups[0] if len(groups) == 1 else "videos"), pair_id


def score_subkey(group: str) -> str | None:
    """The prefix under which a nested score file keeps ``group``'s entries (``sc`` of ``sc_videos``), else None."""
    nested = any(spec.nested_scores and group in spec.cache_groups for spec in DATASETS.values())
    return group.split("_")[0] if nested else None
