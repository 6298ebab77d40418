"""Sharded `procap prepare` + merge: the same cache as one unsharded run; a broken shard set is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from procap.core.errors import ProCapError
from procap.core.validate import parse_shard
from procap.procedure.interpolate import CrossFade
from procap.procedure.pipeline import prepare
from procap.procedure.shards import merge_shards, shard_dir
from tests.support import prepare_options, subprocess_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def vqgan_file(tmp_path):
    from procap.train.vqgan_train import save_vqgan
    from tests.support import tiny_vqgan

    path = tmp_path / "vq.safetensors"
    save_vqgan(path, tiny_vqgan())
    return str(path)


def _vq_options(tmp_path, pairs, vqgan_file, out):
    return prepare_options(tmp_path, pairs, out=str(out), similarity="vqgan", scores_file=None, vqgan=vqgan_file)


def _contents(cache: Path) -> dict:
    """{group/key: (frames, s_bef, s_aft, codes)} of every complete pair in a cache folder."""
    found = {}
    for path in sorted(cache.glob("*.h5")):
        with h5py.File(path, "r") as f:
            for key in f:
                d = f[key]
                assert d.attrs["complete"] == 1
                found[f"{path.stem}/{key}"] = (d[()], d.attrs["s_bef"], d.attrs["s_aft"], d.attrs["codes"])
    return found


def test_two_shards_and_merge_equal_one_run(tmp_path, clevr_pairs, vqgan_file):
    prepare(_vq_options(tmp_path, clevr_pairs, vqgan_file, tmp_path / "whole"), clevr_pairs, interpolator=CrossFade())
    sharded = tmp_path / "sharded"
    for index in range(2):
        opts = _vq_options(tmp_path, clevr_pairs, vqgan_file, sharded)
        opts.shard = (index, 2)
        assert prepare(opts, clevr_pairs, interpolator=CrossFade())["total"] == 3  # 6 pairs: 3 + 3
    assert merge_shards(sharded, clevr_pairs, "clevr-change") == {"merged": 6, "shards": 2}

    whole, merged = _contents(tmp_path / "whole"), _contents(sharded)
    assert sorted(whole) == sorted(merged) and len(whole) == 6
    for name, arrays in whole.items():
        for expected, got in zip(arrays, merged[name]):
            np.testing.assert_array_equal(got, expected, err_msg=name)
    assert json.loads((sharded / "scores.json").read_text()) == json.loads(
        (tmp_path / "whole" / "scores.json").read_text()
    )
    assert not list(sharded.glob(".*merging"))


def test_merge_refuses_a_missing_shard_or_pair(tmp_path, clevr_pairs):
    out = tmp_path / "cache"
    opts = prepare_options(tmp_path, clevr_pairs, out=str(out))
    opts.shard = (0, 2)
    prepare(opts, clevr_pairs, interpolator=CrossFade())
    with pytest.raises(ProCapError, match="shard 1/2 is missing"):
        merge_shards(out, clevr_pairs, "clevr-change")

    opts.shard = (1, 2)
    prepare(opts, clevr_pairs, interpolator=CrossFade())
    shard1 = shard_dir(out, 1, 2)
    group = min(shard1.glob("*.h5"))
    with h5py.File(group, "a") as f:
        dropped = min(f)
        f[dropped].attrs["complete"] = 0  # an interrupted write
    with pytest.raises(ProCapError, match="complete in no shard"):
        merge_shards(out, clevr_pairs, "clevr-change")
    assert not list(out.glob("*.h5"))  # nothing half-written

    with pytest.raises(ProCapError, match="outside the split list"):
        merge_shards(out, [p for p in clevr_pairs if p.id.rsplit("_", 1)[1] != dropped][:2], "clevr-change")


def test_merge_refuses_a_pair_in_two_shards(tmp_path, clevr_pairs):
    out = tmp_path / "cache"
    for index in range(2):
        opts = prepare_options(tmp_path, clevr_pairs, out=str(out))
        opts.shard = (index, 2)
        prepare(opts, clevr_pairs, interpolator=CrossFade())
    src = min(shard_dir(out, 0, 2).glob("*.h5"))
    with h5py.File(src, "r") as a, h5py.File(shard_dir(out, 1, 2) / src.name, "a") as b:
        key = next(k for k in a if k not in b)
        a.copy(a[key], b, name=key)
    with pytest.raises(ProCapError, match="is in shards 0-of-2 and 1-of-2"):
        merge_shards(out, clevr_pairs, "clevr-change")


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "-1/2", "0/0"])
def test_bad_shard_is_one_sentence(text):
    with pytest.raises(ProCapError, match="--shard"):
        parse_shard(text)


def test_torchrun_prepare_shards_and_merges(tmp_path):
    """`torchrun --nproc-per-node 2 -m procap prepare`: one shard per rank, rank 0 merges."""
    from procap.data.synthetic import generate
    from procap.procedure.cache import CachedProcedures
    from procap.train.vqgan_train import save_vqgan
    from tests.support import tiny_vqgan

    generate(tmp_path / "synth", 4, size=32, seed=0, progress=False)
    save_vqgan(tmp_path / "vq.safetensors", tiny_vqgan())
    args = ["--dataset", "clevr-change", "--root", str(tmp_path / "synth"), "--out", str(tmp_path / "c")]
    args += ["--size", "32", "--frames", "3", "--vqgan", str(tmp_path / "vq.safetensors"), "--no-progress"]
    env = subprocess_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "procap"]
    done = subprocess.run(
        [*cmd, "prepare", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "merged" in done.stdout and "from 2 shards" in done.stdout
    from procap.data import load_split

    pairs = load_split("clevr-change", tmp_path / "synth", "train")
    source = CachedProcedures(tmp_path / "c", 1)
    assert all(source(p, None, None).shape == (3, 3, 32, 32) for p in pairs)
    source.close()
