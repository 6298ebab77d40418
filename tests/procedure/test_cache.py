from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from procap.core.errors import ProCapError
from procap.procedure.cache import CachedProcedures, CacheWriter, ProcedureCache, authors_key


def test_authors_keys():
    assert authors_key("CLEVR_semantic_000123.png") == ("sc_videos", "000123.png")
    assert authors_key("CLEVR_nonsemantic_000123.png") == ("nsc_videos", "000123.png")
    assert authors_key("76", "spot-the-diff") == ("spot_videos", "76")
    assert authors_key("Reddit_5", "image-editing-request") == ("edit_videos", "Reddit_5")
    with pytest.raises(ProCapError):
        authors_key("a/b", "spot-the-diff")


def _frames(t=9, s=8, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(t, 3, s, s), dtype=np.uint8)


def test_round_trip_in_the_authors_layout(tmp_path):
    writer = CacheWriter(tmp_path)
    frames = _frames()
    s_bef = np.linspace(1, 0, 9, dtype=np.float32)
    codes = np.arange(9 * 4).reshape(9, 4)
    writer.write("sc_videos", "000001.png", frames, s_bef, s_bef[::-1].copy(), codes, "CLEVR_semantic_000001.png")
    writer.write("nsc_videos", "000001.png", _frames(seed=1), s_bef, s_bef[::-1].copy(), codes)
    writer.export_scores(["nsc_videos", "sc_videos"])
    writer.close()
    # read exactly as the authors' loader does: video[key][:] -> uint8 [T, C, H, W]
    with h5py.File(tmp_path / "sc_videos.h5", "r") as f:
        assert list(f.keys()) == ["000001.png"]
        got = f["000001.png"][:]
        assert got.dtype == np.uint8 and got.shape == (9, 3, 8, 8)
        np.testing.assert_array_equal(got, frames)
        assert f["000001.png"].attrs["complete"] == 1
        assert f["000001.png"].attrs["codes"].dtype == np.int16
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["000001.png"]["sc_sim_matrixes"]["bef_inter_sim"] == [s_bef.tolist()]
    cache = ProcedureCache(tmp_path)
    np.testing.assert_array_equal(cache.codes("sc_videos", "000001.png"), codes)


def test_incomplete_pairs_are_dropped_on_resume(tmp_path):
    with h5py.File(tmp_path / "spot_videos.h5", "w") as f:
        f.create_dataset("1", data=_frames()).attrs["complete"] = 1
        f.create_dataset("2", data=_frames())  # no marker: an interrupted write
    writer = CacheWriter(tmp_path)
    assert writer.completed(["spot_videos"]) == {("spot_videos", "1")}
    writer.close()
    with h5py.File(tmp_path / "spot_videos.h5", "r") as f:
        assert list(f.keys()) == ["1"]


def test_cached_procedures_on_authors_files_with_score_json(tmp_path):
    """Their release: *_videos.h5 under video/ without our attributes, plus their score JSON."""
    (tmp_path / "video").mkdir()
    frames = _frames(s=16)
    with h5py.File(tmp_path / "video" / "sc_videos.h5", "w") as f:
        f.create_dataset("000007.png", data=frames)
    sims = {
        "000007.png": {
            "sc_sim_matrixes": {
                "bef_inter_sim": [[1, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]] * 2,
                "inter_aft_sim": [[0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1]] * 2,
            }
        }
    }
    (tmp_path / "scores.json").write_text(json.dumps(sims))
    source = CachedProcedures(tmp_path, 2, scores_file=tmp_path / "scores.json")
    # s_bef - s_aft is 0 at frame 4 and +-0.2 at frames 3 and 5 (a tie: the earlier one wins)
    group, key, idx = source.indices("CLEVR_semantic_000007.png")
    assert (group, key) == ("sc_videos", "000007.png")
    assert idx.tolist() == [0, 3, 4, 8]
    out = source(type("P", (), {"id": "CLEVR_semantic_000007.png"})(), None, None)
    assert out.shape == (4, 3, 16, 16)
    torch.testing.assert_close(out[0], torch.from_numpy(frames[0]).float() / 255)
    resized = source("CLEVR_semantic_000007.png", torch.rand(3, 8, 8), torch.rand(3, 8, 8))
    assert resized.shape == (4, 3, 8, 8)
    with pytest.raises(ProCapError, match="no entry"):
        source.indices("CLEVR_semantic_000008.png")


def test_authors_files_without_scores_need_the_json(tmp_path):
    with h5py.File(tmp_path / "edit_videos.h5", "w") as f:
        f.create_dataset("Reddit_1", data=_frames())
    source = CachedProcedures(tmp_path / "edit_videos.h5", 2)
    with pytest.raises(ProCapError, match="score file"):
        source.indices("Reddit_1")


def test_missing_cache_is_an_error(tmp_path):
    with pytest.raises(ProCapError, match="does not exist"):
        CachedProcedures(tmp_path / "nowhere", 2)


def test_authors_score_file_is_found_beside_their_videos(tmp_path):
    (tmp_path / "video").mkdir()
    with h5py.File(tmp_path / "video" / "spot_videos.h5", "w") as f:
        f.create_dataset("12", data=_frames())
    ramp = np.linspace(1, 0, 9).tolist()
    (tmp_path / "spot_similarity_scores.json").write_text(
        json.dumps({"12": {"bef_inter_sim": [ramp], "inter_aft_sim": [ramp[::-1]]}})
    )
    source = CachedProcedures(tmp_path, 2)  # as `--procedures DIR` builds it: no scores_file argument
    assert source.indices("12")[2].tolist() == [0, 3, 4, 8]  # frame 4 is the exact middle; 3 and 5 tie


@pytest.mark.parametrize("content", [b"", b"not an HDF5 file\n"], ids=["empty", "text"])
def test_a_damaged_cache_file_names_the_file(tmp_path, content):
    """An empty or non-HDF5 cache file is one sentence naming the file, not h5py's OSError."""
    (tmp_path / "sc_videos.h5").write_bytes(content)
    with pytest.raises(ProCapError, match=r"sc_videos.h5 is not an HDF5 file"):
        CachedProcedures(tmp_path, 2)


def _write_entry(tmp_path, frames, **attrs):
    with h5py.File(tmp_path / "spot_videos.h5", "w") as f:
        f["12"] = frames
        f["12"].attrs.update(attrs)
    return CachedProcedures(tmp_path / "spot_videos.h5", 2)


RAMP = np.linspace(1, 0, 9).astype(np.float32)


@pytest.mark.parametrize(
    "frames,attrs,message",
    [
        ("a string", {"s_bef": RAMP, "s_aft": RAMP}, "holds 12 as object"),
        (np.zeros((9, 8, 8), np.uint8), {"s_bef": RAMP, "s_aft": RAMP}, r"holds 12 as uint8 \(9, 8, 8\)"),
        (_frames().astype(np.float32), {"s_bef": RAMP, "s_aft": RAMP}, "holds 12 as float32"),
        (_frames(), {"s_bef": np.array([b"x"] * 9), "s_aft": RAMP}, "s_bef of 12 as"),
        (_frames(), {"s_bef": RAMP, "s_aft": np.ones((9, 2), np.float32)}, "s_aft of 12 as float32"),
    ],
    ids=["string", "rank-3", "float frames", "text scores", "2-d scores"],
)
def test_wrongly_typed_cache_entries_name_the_file(tmp_path, frames, attrs, message):
    """Wrongly typed cache entries are one sentence naming the file when sampled, not a traceback from the sampler."""
    source = _write_entry(tmp_path, frames, **attrs)
    with pytest.raises(ProCapError, match=message) as info:
        source.sample("12")
    assert "spot_videos.h5" in str(info.value)


def test_wrongly_typed_codes_name_the_file(tmp_path):
    source = _write_entry(tmp_path, _frames(), s_bef=RAMP, s_aft=RAMP[::-1], codes=np.full((9, 4), 0.5))
    with pytest.raises(ProCapError, match="codes of 12 as float64"):
        source.sample("12")


def test_multinomial_streams_differ_between_torchrun_ranks(tmp_path, monkeypatch):
    """Ranks used to share one keyframe stream (seed + worker id only); rank 0 keeps the single-process stream."""
    frames = _frames(s=8)
    with h5py.File(tmp_path / "spot_videos.h5", "w") as f:
        f.create_dataset("1", data=frames)

    def draws(rank: str | None) -> list[float]:
        if rank is None:
            monkeypatch.delenv("RANK", raising=False)
        else:
            monkeypatch.setenv("RANK", rank)
        source = CachedProcedures(tmp_path / "spot_videos.h5", 2, sampling="multinomial", seed=5)
        return torch.rand(8, generator=source._rng()).tolist()

    single, rank0, rank1 = draws(None), draws("0"), draws("1")
    assert single == rank0 == torch.rand(8, generator=torch.Generator().manual_seed(5)).tolist()
    assert rank1 != rank0
