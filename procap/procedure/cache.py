"""The procedure cache: HDF5 files in the authors' layout, plus scores and VQ codes.

Layout of a cache directory written by ``procap prepare``::

    CACHE/
      procap_cache.json   manifest: dataset, splits, l, image size, similarity, VQGAN, format version
      <group>.h5          one file per cache group of the dataset, named as the authors name them
                          (``DatasetSpec.cache_groups`` in procap/data/datasets.py; CLEVR-Change has two:
                          change pairs and distractors)
      scores.json         the similarities in the authors' score-file shape (written when prepare finishes)
      .<group>.h5.pending/  pairs written since the group file was last written anew, one HDF5 file each (a run
                          that failed or was killed leaves them; the next one continues from them: CacheWriter)

Each file holds one dataset per image id at its root, uint8 [T = l + 2, 3, H, W], frame 0 = before and
frame T - 1 = after, keyed as the authors key them (``"000123.png"`` for CLEVR, ``img_id``, ``uid``), so their
loader reads our files and we read theirs. Our extras live in attributes of that dataset: ``s_bef``/``s_aft``
(float32 [T]), ``codes`` (int16/int32 [T, n], VQ indices of every frame), ``pair_id`` and ``source`` (the
dataset images it was built from: :mod:`procap.procedure.sources`). The attribute
``complete`` is written last: a dataset without it is an interrupted write and is redone on resume.

What a file declares is checked before anything is read for it (:func:`check_frames_size`,
:func:`read_attribute`): HDF5 returns a declared shape whose chunks were never written as fill values, and deflate
inflates by up to about a thousand times, so a small file could ask a reader for all memory. A pair's frames may
hold at most :data:`MAX_STORED_FRAMES` frames of at most :data:`MAX_FRAME_SIDE` pixels a side and
:data:`MAX_PAIR_BYTES` in all, in no more bytes than the storage the file gives them (times :data:`MAX_COMPRESSION` when compressed), storage within the file's size;
an attribute at most :data:`MAX_ATTRIBUTE_BYTES` and the file's size.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from procap.core.config import KEYFRAME_SAMPLING
from procap.core.errors import ProCapError
from procap.core.files import (
    OutputError,
    RunFolderLock,
    atomic_write,
    atomic_write_json,
    beside,
    os_error_in,
    remove_dead_temps,
    remove_empty,
    require_space,
    writing,
)
from procap.core.json_files import read_json
from procap.core.validate import environment_integer
from procap.data.datasets import cache_key, score_subkey
from procap.procedure.sampling import CONFIDENCE_SCALES, confidence_weights, sample_keyframes
from procap.procedure.similarity import ScoreFileSimilarity

MANIFEST = "procap_cache.json"
SCORES_JSON = "scores.json"
CACHE_FORMAT = "procap-procedures"
CACHE_VERSION = 1
SPACE_MARGIN = 64 * 2**20  # bytes kept free beyond each pair's data when writing a cache

# Ceilings of what a cache file may declare (module docstring; docs/errors.md). The paper stores l + 2 <= 17 frames
# of 224 px per pair.
MAX_STORED_FRAMES = 4096
MAX_FRAME_SIDE = 2048
MAX_PAIR_BYTES = 2**30  # all frames of one pair (a reader may take them at once)
# Deflate, HDF5's built-in compression, shrinks data by at most about 1032:1 (lzf and szip by less).
MAX_COMPRESSION = 1032
MAX_ATTRIBUTE_BYTES = 64 * 2**20


def check_frames_size(entry: h5py.Dataset, path: Path, key: str) -> None:
    """Refuse a pair's frames (uint8 ``(T, 3, H, W)``) whose declared size is beyond the ceilings or beyond what
    the file stores for them, reading only metadata.

    Raises:
        ProCapError: naming the cache file, the pair's key and the sizes.
    """
    frames, _, height, width = entry.shape
    if not (1 <= frames <= MAX_STORED_FRAMES and 1 <= height <= MAX_FRAME_SIDE and 1 <= width <= MAX_FRAME_SIDE):
        raise ProCapError(
            f"procedure cache file {path} holds {key} as {frames} frames of {height} x {width} pixels, beyond the "
            f"{MAX_STORED_FRAMES} frames of at most {MAX_FRAME_SIDE} pixels a side a pair may have; rebuild it with "
            "`procap prepare`."
        )
    declared = int(entry.size) * entry.dtype.itemsize
    stored = int(entry.id.get_storage_size())
    file_size = path.stat().st_size
    filtered = entry.id.get_create_plist().get_nfilters() > 0
    allowed = stored * (MAX_COMPRESSION if filtered else 1)
    if declared > MAX_PAIR_BYTES:
        raise ProCapError(
            f"procedure cache file {path} declares {declared:,} bytes of frames for {key}, more than the "
            f"{MAX_PAIR_BYTES:,} a pair may have; rebuild it with `procap prepare`."
        )
    if stored > file_size or declared > allowed:
        raise ProCapError(
            f"procedure cache file {path} declares {declared:,} bytes of frames for {key} over {stored:,} bytes of "
            f"storage in a {file_size:,}-byte file (unwritten or over-compressed data); the file is damaged or "
            "malformed, so rebuild it with `procap prepare`."
        )


def read_attribute(attrs: h5py.AttributeManager, name: str, path: Path, key: str, default: Any = None) -> Any:
    """The attribute ``name`` of the dataset ``key`` (``default`` when absent), its declared size checked first.

    Raises:
        ProCapError: the attribute declares more than :data:`MAX_ATTRIBUTE_BYTES` or than the file's size.
    """
    if name not in attrs:
        return default
    attribute = attrs.get_id(name)
    declared = int(np.prod(attribute.shape or (), dtype=np.int64)) * attribute.dtype.itemsize
    limit = min(MAX_ATTRIBUTE_BYTES, path.stat().st_size)
    if declared > limit:
        raise ProCapError(
            f"procedure cache file {path} declares {declared:,} bytes for the attribute {name} of {key}, more than "
            f"the {limit:,} it may have; the file is damaged or malformed, so rebuild it with `procap prepare`."
        )
    return attrs[name]


def authors_key(pair_id: str, dataset: str | None = None) -> tuple[str, str]:
    """Map one of our pair ids to the authors' (file stem, key): :func:`procap.data.datasets.cache_key`."""
    return cache_key(pair_id, dataset)


# ------------------------------------------------------------------------------------------------ writing


PENDING = "pending"  # beside(<group>.h5, PENDING): the folder of the pairs written since the group file was rewritten
_PAIR_SUFFIX = ".h5"
_HASHED = "sha256-"  # a pending pair named by its key's hash: a key too long for a file name, or one starting with "."
_MAX_PAIR_NAME = 200  # bytes, well within every file system's name limit
_GROUP_REWRITE = Path(__file__).with_name("group_rewrite.py")  # the child process that writes a group file


def pending_folder(root: str | Path, group: str) -> Path:
    """Where the pairs of ``group`` written since its file was last rewritten wait, one small HDF5 file each."""
    return beside(Path(root) / f"{group}.h5", PENDING)


def _pending_name(key: str) -> str:
    """The file name of the pending pair ``key``: the key, %-quoted, or its hash when that does not fit."""
    name = quote(key, safe="", errors="surrogatepass") + _PAIR_SUFFIX
    if len(name) > _MAX_PAIR_NAME or name.startswith("."):
        name = _HASHED + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest() + _PAIR_SUFFIX
    return name


def pending_pairs(root: str | Path, group: str) -> dict[str, Path]:
    """``key -> file`` of every pending pair of ``group`` in the cache ``root``.

    Each file was written whole and renamed into place, so every one listed is complete; a killed write leaves
    only its temporary file (a name starting with ``.``), which is not listed.
    """
    folder = pending_folder(root, group)
    found: dict[str, Path] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        name = path.name
        if name.startswith(".") or not name.endswith(_PAIR_SUFFIX):
            continue
        if name.startswith(_HASHED):
            with h5py.File(path, "r") as handle:
                found.update((key, path) for key in handle)
        else:
            found[unquote(name[: -len(_PAIR_SUFFIX)], errors="surrogatepass")] = path
    return found


def _complete_keys(path: Path) -> tuple[set[str], bool]:
    """The complete pairs of the group file ``path`` and whether it also holds incomplete ones (an interrupted
    write of a version that wrote group files in place); read only."""
    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise ProCapError(f"cannot open {path}; it may be damaged or in use ({exc}).") from None
    with handle:
        complete = {key for key in handle if read_attribute(handle[key].attrs, "complete", path, key, 0) == 1}
        return complete, len(complete) < len(handle)


def write_group_file(final: Path, sources: Sequence[tuple[Path, Sequence[str]]]) -> None:
    """Write the group file ``final`` anew from the datasets ``sources`` name (``(file, keys)``, each key once):
    in a child process (:mod:`procap.procedure.group_rewrite`) into a temporary file renamed over ``final``.

    A failure of any kind leaves ``final`` as it was and this process's HDF5 untouched.

    Raises:
        OutputError: the operating system refused the write (disk full, quota, file-size limit), naming ``final``.
        ProCapError: the child failed otherwise.
    """
    needed = sum(Path(path).stat().st_size for path in dict.fromkeys(path for path, _ in sources))
    require_space(final, needed + SPACE_MARGIN, file_bytes=needed)
    names = [
        os.fsencode(path) + b"\0" + key.encode("utf-8", "surrogateescape") for path, keys in sources for key in keys
    ]

    def run_child(temporary: str) -> None:
        done = subprocess.run(
            [sys.executable, "-I", str(_GROUP_REWRITE)],
            input=b"\0".join([os.fsencode(temporary), *names]),
            capture_output=True,
            check=False,
        )
        if done.returncode == 0:
            return
        text = done.stderr.decode("utf-8", "replace").strip()
        failure = os_error_in(RuntimeError(text))  # HDF5 reports the errno in its text
        if failure is not None:
            raise OSError(failure[0], failure[1])
        raise ProCapError(
            f"writing the procedure cache file {final} failed (exit status {done.returncode}: {text[-300:]})."
        )

    atomic_write(final, run_child)


class CacheWriter:
    """Single writer of a cache directory: it holds the directory's lock from here to :meth:`close`.

    A group file is never written in place, because HDF5 does not recover from a write that fails or is killed
    part-way: a file-size limit left a file the next run refused (its pairs lost) and the interpreter crashing at
    exit. Each :meth:`write` stores one pair completely (frames, scores, codes, then the ``complete`` marker) as
    a small HDF5 file built in memory and saved under a temporary name renamed into :func:`pending_folder`, so an
    interruption of any kind loses at most the pair in flight. :meth:`commit` (from :meth:`close` and
    :meth:`export_scores`) writes each group file anew with its pending pairs (:func:`write_group_file`) and then
    deletes them; until that rename the old group file and the pending pairs are what a resumed run continues from.
    """

    def __init__(self, root: str | Path, compression: str | None = None) -> None:
        self.root = Path(root)
        with writing(self.root):
            self.root.mkdir(parents=True, exist_ok=True)
        self.compression = compression
        self._lock: RunFolderLock | None = RunFolderLock(self.root, "the procedure cache")
        self._lock.__enter__()
        self._stale: set[str] = set()  # groups whose file is to be written anew by commit()

    def completed(self, groups: list[str]) -> set[tuple[str, str]]:
        """(group, key) of every complete pair, in the group files or pending; incomplete ones get redone.

        What killed writes left (temporary files) is deleted: under the lock no other writer is running.
        """
        done = set()
        for group in groups:
            final = self.root / f"{group}.h5"
            remove_dead_temps(final)
            folder = pending_folder(self.root, group)
            for dead in folder.glob(".*") if folder.is_dir() else ():
                dead.unlink(missing_ok=True)
            complete, partial = _complete_keys(final) if final.exists() else (set(), False)
            pending = pending_pairs(self.root, group)
            if partial or pending:
                self._stale.add(group)
            done |= {(group, key) for key in complete | set(pending)}
        return done

    def write(
        self,
        group: str,
        key: str,
        frames: np.ndarray,
        s_bef: np.ndarray | None = None,
        s_aft: np.ndarray | None = None,
        codes: np.ndarray | None = None,
        pair_id: str | None = None,
        source: str | None = None,
    ) -> None:
        """Store one pair (pending until :meth:`commit`; a pair written again replaces the stored one).

        Args:
            group, key: file stem and dataset name (see :func:`authors_key`).
            frames: uint8 (T, 3, H, W), before first and after last.
            s_bef, s_aft: float (T,) similarities to before / after.
            codes: integer (T, n) VQ indices of every frame.
            pair_id: our id of the pair (kept for reference).
            source: the images it was built from (:func:`procap.procedure.sources.record`), checked on resume.

        Raises:
            OutputError: the operating system refused the write, naming the group file.
        """
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1] != 3:
            raise ValueError(f"frames must be uint8 (T, 3, H, W), got {frames.dtype} {frames.shape}")
        final = self.root / f"{group}.h5"
        data = self._pair_file(key, frames, s_bef, s_aft, codes, pair_id, source)
        # the pair, and room for it again when the group file is written anew with it
        require_space(final, 2 * len(data) + SPACE_MARGIN, file_bytes=len(data))
        try:
            atomic_write(pending_folder(self.root, group) / _pending_name(key), lambda tmp: Path(tmp).write_bytes(data))
        except OutputError as exc:  # named as the file the user knows, not the pending one
            raise OutputError(exc.errno, exc.strerror, str(final)) from exc
        self._stale.add(group)

    def _pair_file(
        self,
        key: str,
        frames: np.ndarray,
        s_bef: np.ndarray | None,
        s_aft: np.ndarray | None,
        codes: np.ndarray | None,
        pair_id: str | None,
        source: str | None,
    ) -> bytes:
        """The bytes of an HDF5 file holding only this pair (the arguments of :meth:`write`), made in memory:
        HDF5 itself never meets a failing disk."""
        image = io.BytesIO()
        with h5py.File(image, "w") as f:
            dset = f.create_dataset(key, data=frames, compression=self.compression)
            if s_bef is not None:
                dset.attrs["s_bef"] = np.asarray(s_bef, dtype=np.float32)
                dset.attrs["s_aft"] = np.asarray(s_aft, dtype=np.float32)
            if codes is not None:
                codes = np.asarray(codes)
                dtype = np.int16 if codes.max(initial=0) < 2**15 else np.int32
                dset.attrs["codes"] = codes.astype(dtype)
            if pair_id is not None:
                dset.attrs["pair_id"] = pair_id
            if source is not None:
                dset.attrs["source"] = source
            dset.attrs["complete"] = 1  # last: its presence means everything above is in the file
        return image.getvalue()

    def commit(self) -> None:
        """Write each group file with pending pairs anew (its complete pairs and the pending ones, which win), then
        delete the pending files. A failure leaves the group file and the pending pairs as they were."""
        for group in sorted(self._stale):
            final = self.root / f"{group}.h5"
            pending = pending_pairs(self.root, group)
            kept = sorted(_complete_keys(final)[0] - set(pending)) if final.exists() else []
            sources = [(final, kept)] if kept else []
            sources += [(path, [key]) for key, path in pending.items()]
            write_group_file(final, sources)
            for path in pending.values():  # a kill from here on leaves pairs written twice: the next commit's
                path.unlink(missing_ok=True)
            remove_empty([pending_folder(self.root, group)])
            self._stale.discard(group)

    def export_scores(self, groups: list[str]) -> Path:
        """Write ``scores.json`` in the authors' shape from the stored ``s_bef``/``s_aft`` attributes (after
        :meth:`commit`, so that every pair written is in it)."""
        self.commit()
        out: dict[str, Any] = {}
        nested = len(groups) > 1 or score_subkey(groups[0]) is not None
        for group in groups:
            path = self.root / f"{group}.h5"
            if not path.exists():
                continue
            with h5py.File(path, "r") as f:
                for key in f:
                    attrs = f[key].attrs
                    if read_attribute(attrs, "complete", path, key, 0) != 1 or "s_bef" not in attrs:
                        continue
                    s_bef, s_aft = (np.asarray(read_attribute(attrs, name, path, key)) for name in ("s_bef", "s_aft"))
                    entry = {"bef_inter_sim": [s_bef.tolist()], "inter_aft_sim": [s_aft.tolist()]}
                    if nested:
                        out.setdefault(key, {})[f"{score_subkey(group) or group.split('_')[0]}_sim_matrixes"] = entry
                    else:
                        out[key] = entry
        path = self.root / SCORES_JSON
        atomic_write_json(path, out)
        return path

    def close(self) -> None:
        """:meth:`commit` and release the directory's lock (also when the commit fails)."""
        try:
            self.commit()
        finally:
            if self._lock is not None:
                self._lock.__exit__(None, None, None)
                self._lock = None


def stored_sources(root: str | Path, groups: Sequence[str]) -> dict[tuple[str, str], str | None]:
    """``(group, key) -> source`` attribute of every complete pair in ``root``'s group files and pending pairs
    (None: no record).

    Read-only: a resumed run checks them before it writes anything. A file HDF5 cannot open is left out (the
    writer reports it when it opens the file).
    """
    found: dict[tuple[str, str], str | None] = {}
    for group in groups:
        path = Path(root) / f"{group}.h5"
        # (file, the one key to read in it: None for a group file, which holds many)
        files: list[tuple[Path, str | None]] = [(path, None)] if path.is_file() else []
        files += [(pending, key) for key, pending in pending_pairs(root, group).items()]
        for file, only in files:
            try:
                handle = h5py.File(file, "r")
            except OSError:
                continue
            with handle:
                for key, entry in handle.items():
                    if only is not None and key != only:
                        continue
                    if read_attribute(entry.attrs, "complete", file, key, 0) == 1:
                        value = read_attribute(entry.attrs, "source", file, key)
                        found[group, key] = value.decode() if isinstance(value, bytes) else value
    return found


def read_manifest(root: str | Path) -> dict[str, Any] | None:
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    return read_json(path, "cache manifest")


# ------------------------------------------------------------------------------------------------ reading


class ProcedureCache:
    """Read-only access to a cache directory (ours or the authors' ``*_videos.h5`` files).

    File handles are opened lazily and per process, so one instance can be shared with DataLoader workers
    (each forked worker opens its own handles on first use).

    Args:
        root: a cache directory, one ``*_videos.h5`` file, or a directory holding the authors' ``video/``
            folder.
        scores_file: the authors' score JSON; default: ``scores.json`` in the directory if present.
    """

    def __init__(self, root: str | Path, scores_file: str | Path | None = None) -> None:
        root = Path(root)
        if not root.exists():
            raise ProCapError(f"procedure cache {root} does not exist; build it with `procap prepare`.")
        if root.is_file():
            self.paths = {root.stem: root}
            directory = root.parent
        else:
            directory = root / "video" if not list(root.glob("*.h5")) and (root / "video").is_dir() else root
            self.paths = {p.stem: p for p in sorted(directory.glob("*.h5"))}
        if not self.paths:
            raise ProCapError(f"procedure cache {root} holds no .h5 files.")
        for path in self.paths.values():
            if not h5py.is_hdf5(path):
                raise ProCapError(
                    f"procedure cache file {path} is not an HDF5 file (empty or damaged); rebuild it with `procap prepare`."
                )
        self.manifest = read_manifest(directory) or {}
        if scores_file is None and not self.manifest:
            scores_file = _find_score_file(root if root.is_dir() else directory, directory)

        self.score_file = ScoreFileSimilarity(scores_file) if scores_file is not None else None
        self._handles: dict[str, h5py.File] = {}
        self._pid = -1

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handles"], state["_pid"] = {}, -1
        return state

    def _open(self, group: str) -> h5py.File:
        if self._pid != os.getpid():  # forked: never reuse the parent's HDF5 handles
            self._handles, self._pid = {}, os.getpid()
        if group not in self._handles:
            if group not in self.paths:
                raise KeyError(group)
            try:
                self._handles[group] = h5py.File(self.paths[group], "r")
            except OSError as exc:
                raise ProCapError(f"cannot read procedure cache file {self.paths[group]} ({exc}).") from None
        return self._handles[group]

    def close(self) -> None:
        """Close this process's file handles (they reopen on the next read)."""
        for f in self._handles.values():
            f.close()
        self._handles = {}

    def locate(self, pair_id: str) -> tuple[str, str]:
        """(group, key) of a pair id, checked to exist in the cache."""
        group, key = authors_key(pair_id, self.manifest.get("dataset"))
        if group not in self.paths and len(self.paths) == 1:
            group = next(iter(self.paths))
        if group not in self.paths or key not in self._open(group):
            where = self.paths.get(group, next(iter(self.paths.values())).parent / f"{group}.h5")
            raise ProCapError(
                f"procedure cache file {where} has no entry for pair {pair_id} (key {key}); "
                f"run `procap prepare` for this split."
            )
        entry = self._open(group)[key]
        if not isinstance(entry, h5py.Dataset) or entry.dtype != np.uint8 or entry.ndim != 4 or entry.shape[1] != 3:
            raise ProCapError(
                f"procedure cache file {self.paths[group]} holds {key} as {_describe(entry)}, "
                f"not uint8 frames (T, 3, H, W); rebuild it with `procap prepare`."
            )
        check_frames_size(entry, self.paths[group], key)  # every read of the pair passes here first
        return group, key

    def frames(self, group: str, key: str, indices: list[int] | None = None) -> np.ndarray:
        """uint8 (T, 3, H, W), or only the frames at ``indices`` (sorted)."""
        dset = self._open(group)[key]
        return dset[()] if indices is None else dset[list(indices)]

    def stored_frames(self, group: str, key: str) -> int:
        return int(self._open(group)[key].shape[0])

    def similarities(self, group: str, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(s_bef (T,), s_aft (T,)) from our attributes, else from the score file."""
        attrs = self._open(group)[key].attrs
        if "s_bef" in attrs:
            return self._scores(attrs, "s_bef", group, key), self._scores(attrs, "s_aft", group, key)
        if self.score_file is None:
            raise ProCapError(
                f"{self.paths[group]} stores no scores for {key}; pass the authors' score file (scores_file=...)."
            )
        return self.score_file(None, (score_subkey(group), key))

    def _scores(self, attrs: h5py.AttributeManager, name: str, group: str, key: str) -> torch.Tensor:
        """One stored similarity attribute as a float32 (T,) tensor, checked to be numbers."""
        stored = read_attribute(attrs, name, self.paths[group], key)
        values = np.asarray(stored) if stored is not None else np.zeros(0, dtype=object)
        if values.ndim != 1 or not np.issubdtype(values.dtype, np.number):
            raise ProCapError(
                f"procedure cache file {self.paths[group]} holds {name} of {key} as {values.dtype} "
                f"{values.shape}, not a list of numbers; rebuild it with `procap prepare`."
            )
        return torch.from_numpy(values.astype(np.float32))

    def codes(self, group: str, key: str) -> np.ndarray | None:
        codes = read_attribute(self._open(group)[key].attrs, "codes", self.paths[group], key)
        if codes is None:
            return None
        codes = np.asarray(codes)
        if codes.ndim != 2 or not np.issubdtype(codes.dtype, np.integer):
            raise ProCapError(
                f"procedure cache file {self.paths[group]} holds codes of {key} as {codes.dtype} {codes.shape}, "
                f"not integer VQ indices (T, n); rebuild it with `procap prepare`."
            )
        return codes


def _describe(entry: object) -> str:
    """How an HDF5 object looks, for messages: '<dtype> <shape>' for a dataset, else its kind."""
    if isinstance(entry, h5py.Dataset):
        return f"{entry.dtype} {entry.shape}"
    return type(entry).__name__.lower()


def keyframe_statistics(
    cache_path: str | Path, pairs: Sequence[Any], num_keyframes: int = 2, confidence: str = "standardize"
) -> dict[str, Any]:
    """Which top-k keyframes a cache yields for ``pairs``: do they differ across pairs and follow the change?

    Returns:
        ``{"pairs", "distinct": number of distinct keyframe sets, "most_common": [set, share], "earliest": share of
        pairs given the first k intermediates, "mean_position": {change type: mean keyframe index in 1..l}}``.
    """
    source = CachedProcedures(cache_path, num_keyframes, confidence=confidence)
    try:
        chosen: list[tuple[int, ...]] = []  # each pair's keyframe indices, in 1..l
        by_type: dict[str, list[int]] = {}  # change type -> the keyframe indices of its pairs
        for pair in pairs:
            middle = tuple(source.indices(str(getattr(pair, "id", pair)))[2][1:-1].tolist())
            chosen.append(middle)
            by_type.setdefault(getattr(pair, "change_type", None) or "pair", []).extend(middle)
    finally:
        source.close()
    counts: dict[tuple, int] = {}
    for middle in chosen:
        counts[middle] = counts.get(middle, 0) + 1
    common, times = max(counts.items(), key=lambda item: item[1])
    earliest = tuple(range(1, num_keyframes + 1))
    return {
        "pairs": len(chosen),
        "confidence": confidence,
        "distinct": len(counts),
        "most_common": [list(common), times / len(chosen)],
        "earliest": counts.get(earliest, 0) / len(chosen),
        "mean_position": {t: sum(v) / len(v) for t, v in sorted(by_type.items()) if v},
    }


def _find_score_file(*folders: Path) -> Path | None:
    """The authors' files keep scores only in a JSON (``scores.json`` or ``<dset>_similarity_scores.json``)."""
    for folder in dict.fromkeys(folders):  # unique, in order
        candidates = [folder / SCORES_JSON, *sorted(folder.glob("*similarity_scores.json"))]
        for path in candidates:
            if path.is_file():
                return path
    return None


class CachedProcedures:
    """Stage-1 procedure source: ``(pair, before, after) -> (k + 2, 3, S, S)`` float in [0, 1].

    Reads a cache (ours, or the authors' released ``*_videos.h5`` with their score JSON), computes the
    confidence weights from the stored similarities, samples k keyframes (top-k or multinomial without
    replacement) and returns them in temporal order between before and after, resized to S when the cache
    was written at another size. ``before``/``after`` given by the caller replace the stored end frames
    when they have the output size (so stage 1 sees exactly the preprocessing of stage 2).

    Args:
        cache_path: cache directory or ``.h5`` file.
        num_keyframes: k.
        sampling: ``"topk"`` or ``"multinomial"``.
        scores_file: the authors' score JSON (needed for their files, which store no scores).
        image_size: output side S (default: the caller's image size, else the cache's).
        seed: seeds the multinomial sampler; each process (torchrun ``RANK``) and DataLoader worker draws its own
            stream, ``seed + rank * workers + worker id``.
        confidence: how the similarities become weights, :data:`procap.procedure.sampling.CONFIDENCE_SCALES`
            (default ``standardize``; ``paper`` is the formula as printed, flat for near-1 similarities).
    """

    def __init__(
        self,
        cache_path: str | Path,
        num_keyframes: int = 2,
        sampling: str = "topk",
        scores_file: str | Path | None = None,
        image_size: int | None = None,
        seed: int = 0,
        confidence: str = "standardize",
    ) -> None:
        if sampling not in KEYFRAME_SAMPLING:
            raise ProCapError(f"sampling must be one of {', '.join(KEYFRAME_SAMPLING)}, got {sampling!r}.")
        if confidence not in CONFIDENCE_SCALES:
            raise ProCapError(f"confidence must be one of {', '.join(CONFIDENCE_SCALES)}, got {confidence!r}.")
        self.confidence = confidence
        self.cache = ProcedureCache(cache_path, scores_file)
        self.k, self.sampling, self.image_size, self.seed = int(num_keyframes), sampling, image_size, seed
        self._generator: torch.Generator | None = None
        self._gen_pid = -1

    def close(self) -> None:
        """Close the HDF5 handles (needed before another writer opens the same files in this process)."""
        self.cache.close()

    def _rng(self) -> torch.Generator:
        if self._generator is None or self._gen_pid != os.getpid():
            info = torch.utils.data.get_worker_info()
            workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
            # RANK is in the environment of every torchrun process and its workers; without it streams would repeat
            # across ranks.
            rank = environment_integer("RANK", 0)
            self._generator = torch.Generator().manual_seed(self.seed + rank * workers + worker)
            self._gen_pid = os.getpid()
        return self._generator

    def check_pairs(self, pairs: Sequence[Any]) -> None:
        """Every pair has a well-typed entry with one score per stored frame, checked before training starts.

        Reads only HDF5 metadata and the score attributes, so a damaged cache fails in the first seconds instead of
        at the batch that reaches the bad entry (with a half-started run folder left behind).

        Raises:
            ProCapError: naming the cache file and the first pair at fault.
        """
        for pair in pairs:
            pair_id = str(getattr(pair, "id", pair))
            group, key = self.cache.locate(pair_id)
            s_bef, s_aft = self.cache.similarities(group, key)
            total = self.cache.stored_frames(group, key)
            if s_bef.shape[0] != total or s_aft.shape[0] != total:
                raise ProCapError(
                    f"procedure cache file {self.cache.paths[group]} holds {s_bef.shape[0]} / {s_aft.shape[0]} "
                    f"similarity scores for the {total} frames of {key}; rebuild it with `procap prepare`."
                )

    def indices(self, pair_id: str) -> tuple[str, str, torch.Tensor]:
        """(group, key, (k + 2,) frame indices into the stored frames)."""
        group, key = self.cache.locate(pair_id)
        s_bef, s_aft = self.cache.similarities(group, key)
        total = self.cache.stored_frames(group, key)
        if s_bef.shape[0] != total:
            raise ProCapError(f"{key}: {s_bef.shape[0]} similarity scores for {total} stored frames.")
        weights = confidence_weights(s_bef, s_aft, self.confidence)
        gen = self._rng() if self.sampling == "multinomial" else None
        return group, key, sample_keyframes(weights, self.k, self.sampling, gen)

    def sample(self, pair: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """((k + 2, 3, H, W) float frames at the cache's size, (k + 2) * n codes or None)."""
        pair_id = getattr(pair, "id", pair)
        group, key, idx = self.indices(str(pair_id))
        frames = torch.from_numpy(self.cache.frames(group, key, idx.tolist())).float() / 255.0
        stored = self.cache.codes(group, key)
        codes = torch.from_numpy(stored[idx.numpy()].astype(np.int64)).reshape(-1) if stored is not None else None
        return frames, codes

    def __call__(
        self, pair: Any, before: torch.Tensor | None = None, after: torch.Tensor | None = None
    ) -> torch.Tensor:
        frames, _ = self.sample(pair)
        size = self.image_size or (before.shape[-1] if before is not None else frames.shape[-1])
        if frames.shape[-1] != size or frames.shape[-2] != size:
            frames = F.interpolate(
                frames, size=(size, size), mode="bicubic", align_corners=False, antialias=True
            ).clamp(0.0, 1.0)
        if before is not None and after is not None and before.shape == frames.shape[1:]:
            frames[0], frames[-1] = before.to(frames.dtype), after.to(frames.dtype)
        return frames

    def codes_for(self, pairs: list[Any]) -> torch.Tensor:
        """(len(pairs), (k + 2) * n) int64 stored codes of the top-k frames (stage-1 MSM targets)."""
        if self.sampling != "topk":
            raise ProCapError("precomputed codes per pair need sampling='topk' (multinomial changes the frames).")
        rows = []
        for pair in pairs:
            _, codes = self.sample(pair)
            if codes is None:
                raise ProCapError(
                    f"the procedure cache stores no VQ codes for {getattr(pair, 'id', pair)}; "
                    f"rebuild it with `procap prepare --vqgan CKPT`."
                )
            rows.append(codes)
        return torch.stack(rows)
