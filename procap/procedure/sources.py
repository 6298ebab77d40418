"""The dataset images a cached pair was built from, recorded with the pair and checked when a cache is resumed.

The manifest's content key covers the models and score files; the images are too many to hash on every resume
(CLEVR-Change: 80,000 files), so each pair records its own two images as it is written, in the attribute
``source`` of its HDF5 dataset: per image its file name, size, modification time (ns) and SHA-256. A resumed
``procap prepare`` checks every pair it would skip:

- size and modification time equal to the record: unchanged (a ``stat``, no read);
- otherwise the file is hashed: the same SHA-256 passes (a copy, a ``touch``), another is refused, naming the image.

Trade-off: the hash is computed once per image as the pair is written (the worker reads the file anyway) and on
resume only for files whose size or time changed, so resuming a cache of 80,000 pairs costs 160,000 ``stat``
calls, not a read of the whole dataset. An image rewritten with other pixels but the same size and modification
time (a deliberate ``touch -d`` or a copy that keeps times, of a file of the same size) is not detected; delete the
cache or choose a new ``--out`` after such an edit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from procap.core.errors import ProCapError
from procap.core.files import sha256_of
from procap.core.json_files import parse_json


def fingerprint(path: str | os.PathLike) -> list[Any]:
    """``[name, size, mtime_ns, sha256]`` of an image file (stat taken before the read)."""
    stat = os.stat(path)
    return [Path(path).name, stat.st_size, stat.st_mtime_ns, sha256_of(path)]


def record(pair: Any) -> str:
    """The ``source`` attribute of a pair: the fingerprints of its before and after images, as JSON."""
    return json.dumps({"before": fingerprint(pair.before_path), "after": fingerprint(pair.after_path)})


def check_unchanged(pair: Any, stored: str | None, cache: str | os.PathLike) -> None:
    """Raise a one-sentence :class:`ProCapError` when ``pair``'s images differ from those its cached entry used.

    Args:
        pair: the dataset pair (``id``, ``before_path``, ``after_path``).
        stored: its ``source`` attribute, or None for an entry written without one.
        cache: the cache folder, for the message.
    """
    if stored is None:
        raise ProCapError(
            f"cache {cache} holds pair {pair.id} without a record of the images it was built from (an older "
            "procap wrote it), so a resumed run cannot tell whether the dataset changed; choose a new --out."
        )
    try:
        sources = parse_json(stored, f"the image record of pair {pair.id} in cache {cache}")
        recorded = {side: sources[side] for side in ("before", "after")}
    except (ProCapError, TypeError, KeyError):
        raise ProCapError(
            f"cache {cache} holds a malformed record of the images of pair {pair.id}; choose a new --out."
        ) from None
    for side, path in (("before", pair.before_path), ("after", pair.after_path)):
        try:
            _name, size, mtime_ns, digest = recorded[side]
            stat = os.stat(path)
        except FileNotFoundError:
            raise ProCapError(
                f"image {path} of pair {pair.id}, cached in {cache}, no longer exists; restore the dataset or "
                "choose a new --out."
            ) from None
        except (ValueError, TypeError):
            raise ProCapError(
                f"cache {cache} holds a malformed record of the images of pair {pair.id}; choose a new --out."
            ) from None
        if (stat.st_size, stat.st_mtime_ns) == (size, mtime_ns):
            continue
        if sha256_of(path) != digest:
            raise ProCapError(
                f"image {path} changed since cache {cache} was built from it (pair {pair.id}, sha256 {digest[:12]}... "
                "then); rerun with the dataset's original images or choose a new --out."
            )
