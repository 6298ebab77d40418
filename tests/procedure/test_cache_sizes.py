"""A procedure cache file's declared sizes are checked before anything is read for them (issue 39 B).

HDF5 gives back a declared shape whose chunks were never written as fill values, so a file of a few KB can declare
hundreds of MB of frames; each case below is such a file, crafted at run time, and must be refused in one sentence
naming the file, with the reader's peak memory far below what the file asks for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from procap.core.errors import ProCapError
from procap.procedure import cache as cache_module
from procap.procedure.cache import CachedProcedures, CacheWriter, ProcedureCache
from tests.support import PeakMemory

PAIR = "CLEVR_semantic_000001.png"  # stored as 000001.png in sc_videos.h5
KEY = "000001.png"
FRAMES = 17  # l + 2 for l = 15: every frame is a keyframe candidate
SIDE = 2048  # 17 x 3 x 2048 x 2048 bytes: 214 MB declared
SMALL_ALLOCATION = 64 * 2**20


def _scores(entry: h5py.Dataset, frames: int = FRAMES) -> None:
    entry.attrs["s_bef"] = np.linspace(1, 0, frames, dtype=np.float32)
    entry.attrs["s_aft"] = np.linspace(0, 1, frames, dtype=np.float32)
    entry.attrs["complete"] = 1


def _unwritten(path: Path) -> None:
    """Chunked frames whose chunks were never written: the file stores none of the 214 MB it declares."""
    with h5py.File(path, "w") as f:
        _scores(f.create_dataset(KEY, shape=(FRAMES, 3, SIDE, SIDE), dtype=np.uint8, chunks=(1, 3, 64, 64)))


def _compressed_unwritten(path: Path) -> None:
    """Deflated frames with one chunk written: far more than deflate's 1032:1 could inflate from what is stored."""
    with h5py.File(path, "w") as f:
        entry = f.create_dataset(
            KEY, shape=(FRAMES, 3, SIDE, SIDE), dtype=np.uint8, chunks=(1, 3, 64, 64), compression="gzip"
        )
        entry[0, :, :64, :64] = 7
        _scores(entry)


def _too_many_frames(path: Path) -> None:
    with h5py.File(path, "w") as f:
        _scores(f.create_dataset(KEY, data=np.zeros((5000, 3, 1, 1), np.uint8)), 5000)


def _too_wide(path: Path) -> None:
    with h5py.File(path, "w") as f:
        _scores(f.create_dataset(KEY, data=np.zeros((FRAMES, 3, 1, 5000), np.uint8)))


def _large_attribute(path: Path) -> None:
    """Scores of 40,000 floats (160 KB) where the test lowers the attribute ceiling to 64 KB (an attribute over
    64 KB needs the newer file format's dense attribute storage)."""
    with h5py.File(path, "w", libver="latest") as f:
        entry = f.create_dataset(KEY, data=np.zeros((FRAMES, 3, 4, 4), np.uint8))
        _scores(entry)
        entry.attrs["s_bef"] = np.zeros(40_000, np.float32)


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("unwritten chunks", _unwritten, "declares 213,909,504 bytes of frames"),
    ("compressed, mostly unwritten", _compressed_unwritten, "declares 213,909,504 bytes of frames"),
    ("too many frames", _too_many_frames, "5000 frames"),
    ("frames too wide", _too_wide, "1 x 5000 pixels"),
    ("attribute over the ceiling", _large_attribute, "attribute s_bef"),
]


@pytest.mark.parametrize(("build", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_cache_file_cannot_make_the_reader_allocate_what_it_does_not_store(tmp_path, monkeypatch, build, needle):
    monkeypatch.setattr(cache_module, "MAX_ATTRIBUTE_BYTES", 64 * 2**10)
    path = tmp_path / "sc_videos.h5"
    build(path)
    assert path.stat().st_size < 2**20
    procedures = CachedProcedures(tmp_path, num_keyframes=FRAMES - 2)
    with PeakMemory() as peak, pytest.raises(ProCapError) as caught:
        procedures.sample(PAIR)
    message = str(caught.value)
    assert needle in message and str(path) in message and "\n" not in message, message
    assert peak.growth < SMALL_ALLOCATION, f"the refused read took {peak.growth / 2**20:.0f} MiB at its peak"


def test_a_cache_written_by_the_writer_passes_the_checks(tmp_path):
    frames = np.random.default_rng(0).integers(0, 256, size=(FRAMES, 3, 16, 16), dtype=np.uint8)
    for compression in (None, "gzip"):
        folder = tmp_path / str(compression)
        writer = CacheWriter(folder, compression=compression)
        s_bef = np.linspace(1, 0, FRAMES, dtype=np.float32)
        writer.write("sc_videos", KEY, frames, s_bef, s_bef[::-1].copy(), np.zeros((FRAMES, 4), np.int64), PAIR)
        writer.close()
        got, codes = CachedProcedures(folder, num_keyframes=2).sample(PAIR)
        assert got.shape == (4, 3, 16, 16) and codes is not None
        group, key = ProcedureCache(folder).locate(PAIR)
        np.testing.assert_array_equal(ProcedureCache(folder).frames(group, key), frames)
