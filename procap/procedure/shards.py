"""Sharded ``procap prepare``: several processes or machines build one procedure cache, then one merge.

``procap prepare --shard I/N`` (0 <= I < N) processes every N-th pair of the split list, starting at pair I, into
``OUT/shards/I-of-N/`` (a complete, resumable cache of its own). ``procap prepare --merge`` then checks that every
pair of the split list is complete in exactly one shard, that all shards were built with the same settings, and
copies them into ``OUT/<group>.h5`` (each file written under a temporary name and renamed) with the manifest and
``scores.json`` (the ``--shard`` value itself is read by :func:`procap.core.validate.parse_shard`, without torch).
Under ``torchrun`` the ranks pick their shard from ``RANK``/``WORLD_SIZE`` and rank 0 merges
once all are done.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py

from procap.core.errors import ProCapError
from procap.core.files import atomic_write_json
from procap.procedure.cache import (
    MANIFEST,
    CacheWriter,
    authors_key,
    read_attribute,
    read_manifest,
    write_group_file,
)

SHARDS_DIR = "shards"
_SHARD_NAME = re.compile(r"^(\d+)-of-(\d+)$")


def shard_dir(out: str | Path, index: int, count: int) -> Path:
    """Where shard ``index`` of ``count`` writes its cache."""
    return Path(out) / SHARDS_DIR / f"{index}-of-{count}"


def shard_pairs(pairs: Sequence[Any], index: int, count: int) -> list[Any]:
    """Pairs ``index``, ``index + count``, ...: every pair lands in exactly one shard, shards differ by one at most."""
    return list(pairs[index::count])


def _find_shards(out: Path) -> list[Path]:
    """The shard folders of ``out``, checked to be one complete set ``0-of-N`` ... ``N-1-of-N``."""
    found = {}
    for path in sorted((out / SHARDS_DIR).glob("*-of-*")):
        match = _SHARD_NAME.match(path.name)
        if match and path.is_dir():
            found[int(match[1]), int(match[2])] = path
    if not found:
        raise ProCapError(f"--merge: {out / SHARDS_DIR} holds no shard folders; run procap prepare --shard I/N first")
    counts = {n for _, n in found}
    if len(counts) > 1:
        raise ProCapError(f"--merge: {out / SHARDS_DIR} mixes shard sets of {sorted(counts)} shards; keep one set")
    count = counts.pop()
    missing = [i for i in range(count) if (i, count) not in found]
    if missing:
        raise ProCapError(
            f"--merge: shard {missing[0]}/{count} is missing; run procap prepare --shard {missing[0]}/{count}"
        )
    return [found[i, count] for i in range(count)]


def _common_manifest(shards: list[Path]) -> dict[str, Any]:
    """The shards' manifest; every shard must have been built with the same settings."""
    manifests: list[dict[str, Any]] = []
    for shard, manifest in zip(shards, [read_manifest(s) for s in shards]):  # every one read before any is refused
        if manifest is None:
            raise ProCapError(f"--merge: shard {shard} has no {MANIFEST}; it never started")
        manifests.append(manifest)
    first = {k: v for k, v in manifests[0].items() if k != "splits"}
    for shard, manifest in zip(shards[1:], manifests[1:]):
        other = {k: v for k, v in manifest.items() if k != "splits"}
        if other != first:
            key = next(k for k in sorted(set(first) | set(other)) if first.get(k) != other.get(k))
            raise ProCapError(
                f"--merge: shard {shard} was built with {key}={other.get(key)!r}, shard {shards[0]} with "
                f"{first.get(key)!r}; rebuild it with the same settings"
            )
    return manifests[0]


def _locate(shards: list[Path]) -> dict[tuple[str, str], Path]:
    """(group, key) -> the shard holding it complete; a pair complete in two shards is an error."""
    where: dict[tuple[str, str], Path] = {}
    for shard in shards:
        for path in sorted(shard.glob("*.h5")):
            with h5py.File(path, "r") as f:
                for key in f:
                    if read_attribute(f[key].attrs, "complete", path, key, 0) != 1:
                        continue
                    if (path.stem, key) in where:
                        raise ProCapError(
                            f"--merge: pair {path.stem}/{key} is in shards {where[path.stem, key].name} and "
                            f"{shard.name}; shards must come from one --shard I/N set"
                        )
                    where[path.stem, key] = shard
    return where


def merge_shards(out: str | Path, pairs: Sequence[Any], dataset: str) -> dict[str, int]:
    """Merge ``out/shards/*-of-N`` into the cache ``out``; returns ``{"merged": n, "shards": N}``.

    Args:
        out: the cache folder the shards were written under.
        pairs: the full pair list the shards were cut from (the same splits and ``--limit``).
        dataset: the dataset name (decides the group and key of each pair).

    Raises:
        ProCapError: a shard is missing or was built differently, a pair is in no shard or in two, or a shard
            holds a pair that is not in the list.
    """
    out = Path(out)
    shards = _find_shards(out)
    manifest = _common_manifest(shards)
    where = _locate(shards)
    expected = [(authors_key(p.id, dataset), p) for p in pairs]
    for (group, key), pair in expected:
        if (group, key) not in where:
            raise ProCapError(
                f"--merge: pair {pair.id} ({group}.h5 / {key}) is complete in no shard; finish the shards first"
            )
    extra = set(where) - {gk for gk, _ in expected}
    if extra:
        group, key = min(extra)
        raise ProCapError(f"--merge: shards hold {len(extra)} pair(s) outside the split list, e.g. {group}/{key}")
    groups = sorted({g for g, _ in where})
    for group in groups:
        _write_group(out, group, {k: where[g, k] for g, k in where if g == group})
    atomic_write_json(out / MANIFEST, {**manifest, "shards": len(shards)})
    if manifest.get("similarity") != "scores":
        writer = CacheWriter(out)
        try:
            writer.export_scores(groups)
        finally:
            writer.close()
    return {"merged": len(where), "shards": len(shards)}


def _write_group(out: Path, group: str, sources: dict[str, Path]) -> None:
    """``out/<group>.h5`` from the shards' copies of its datasets (attributes included): written in a child process
    into a temporary file that is renamed into place (:func:`procap.procedure.cache.write_group_file`)."""
    by_shard: dict[Path, list[str]] = {}
    for key in sorted(sources):
        by_shard.setdefault(sources[key] / f"{group}.h5", []).append(key)
    write_group_file(out / f"{group}.h5", list(by_shard.items()))
