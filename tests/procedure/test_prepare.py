"""`procap prepare` pipeline: end to end, resume after interruption (exception and killed process), errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from procap.core.errors import ProCapError
from procap.procedure.cache import CachedProcedures, stored_sources
from procap.procedure.interpolate import CrossFade
from procap.procedure.pipeline import prepare
from tests.support import prepare_options


def validate(cache_dir: Path, pairs) -> None:
    """Every pair complete, frames [5, 3, 32, 32] uint8 starting with the before image."""
    source = CachedProcedures(cache_dir, 1)
    for p in pairs:
        group, key, _ = source.indices(p.id)
        with h5py.File(cache_dir / f"{group}.h5", "r") as f:
            d = f[key]
            assert d.attrs["complete"] == 1 and d.shape == (5, 3, 32, 32) and d.dtype == np.uint8
        assert source(p, None, None).shape == (3, 3, 32, 32)
    source.close()


def test_prepare_end_to_end_with_vqgan_codes(tmp_path, clevr_pairs):
    from procap.train.vqgan_train import save_vqgan
    from tests.support import tiny_vqgan

    save_vqgan(tmp_path / "vq.safetensors", tiny_vqgan())
    opts = prepare_options(
        tmp_path,
        clevr_pairs[:2],
        similarity="vqgan",
        scores_file=None,
        vqgan=str(tmp_path / "vq.safetensors"),
        direct=True,
    )
    assert prepare(opts, clevr_pairs[:2]) == {"written": 2, "skipped": 0, "total": 2}
    validate(tmp_path / "cache", clevr_pairs[:2])
    source = CachedProcedures(tmp_path / "cache", 1)
    codes = source.codes_for(clevr_pairs[:2])
    assert codes.shape == (2, 3 * 16 * 16) and codes.dtype == torch.int64  # T = 3 frames x (32/2)^2 tokens
    source.close()
    scores = json.loads((tmp_path / "cache" / "scores.json").read_text())
    assert set(scores["000000.png"]) == {"sc_sim_matrixes", "nsc_sim_matrixes"}
    assert prepare(opts, clevr_pairs[:2])["skipped"] == 2  # nothing redone


class FailingInterpolator(CrossFade):
    """Raises after a number of midpoint calls, like a crash in the middle of a run."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    def __call__(self, before, after):
        self.calls -= 1
        if self.calls < 0:
            raise RuntimeError("simulated crash")
        return super().__call__(before, after)


def test_resume_after_an_exception(tmp_path, clevr_pairs):
    opts = prepare_options(tmp_path, clevr_pairs)
    with pytest.raises(RuntimeError, match="simulated"):
        prepare(opts, clevr_pairs, interpolator=FailingInterpolator(calls=2 * 3 + 1))  # l=3: 2 calls per pair
    with h5py.File(tmp_path / "cache" / "sc_videos.h5", "r") as f:
        assert all(f[k].attrs["complete"] == 1 for k in f)
    stats = prepare(opts, clevr_pairs, interpolator=CrossFade())
    assert stats == {"written": 3, "skipped": 3, "total": 6}
    validate(tmp_path / "cache", clevr_pairs)


RUNNER = """
import sys, time
from pathlib import Path
from types import SimpleNamespace
import json
sys.path.insert(0, {here!r})
from procap.procedure.interpolate import CrossFade
from procap.procedure.pipeline import PrepareOptions, prepare

class Slow(CrossFade):
    def __call__(self, b, a):
        with open(sys.argv[3], "a") as log:  # one line per midpoint call: the test waits on it
            log.write("call\\n")
        time.sleep(0.1)
        return super().__call__(b, a)

if __name__ == "__main__":
    pairs = [SimpleNamespace(**p) for p in json.loads(Path(sys.argv[1]).read_text())]
    opts = PrepareOptions(**json.loads(Path(sys.argv[2]).read_text()))
    prepare(opts, pairs, interpolator=Slow())
"""


@pytest.mark.parametrize(("sig", "batch"), [(signal.SIGTERM, 1), (signal.SIGKILL, 1), (signal.SIGTERM, 8)])
def test_resume_after_killing_prepare(tmp_path, clevr_pairs, sig, batch):
    """Kill a running `prepare` process mid-run; the file stays valid and a rerun completes it.

    With SIGTERM the pairs synthesized but not yet scored (batch 8) are still written before exiting.
    """
    pairs = clevr_pairs
    opts = prepare_options(tmp_path, pairs, score_batch=batch)
    (tmp_path / "pairs.json").write_text(
        json.dumps([{"id": p.id, "before_path": str(p.before_path), "after_path": str(p.after_path)} for p in pairs])
    )
    (tmp_path / "opts.json").write_text(json.dumps({**vars(opts), "splits": list(opts.splits)}))
    # the checkout's procap, not an installed copy of another checkout
    (tmp_path / "runner.py").write_text(RUNNER.format(here=str(Path(__file__).resolve().parents[2])))
    log = tmp_path / "calls.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(tmp_path / "runner.py"),
            str(tmp_path / "pairs.json"),
            str(tmp_path / "opts.json"),
            str(log),
        ],
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 60
    # l = 3 takes 2 midpoint calls per pair: after the 6th call two pairs are written and the third is in flight
    while time.time() < deadline and proc.poll() is None and (not log.exists() or len(log.read_text().split()) < 6):
        time.sleep(0.02)
    if proc.poll() is not None:  # it must still be running to be killed: say why it stopped
        pytest.fail(f"prepare exited with {proc.returncode} before the kill: {proc.stderr.read().decode()[-800:]}")
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0, err.decode()[-500:]
    # the pairs committed: in the group files, or pending beside them where the kill came before they were rewritten
    written_before = len(stored_sources(tmp_path / "cache", ["sc_videos", "nsc_videos"]))
    assert 1 <= written_before < len(pairs)
    stats = prepare(opts, pairs, interpolator=CrossFade())
    assert stats["skipped"] == written_before and stats["written"] == len(pairs) - written_before
    validate(tmp_path / "cache", pairs)


def test_unreadable_image_names_the_file(tmp_path, clevr_pairs):
    Path(clevr_pairs[1].after_path).write_bytes(b"not a png")
    with pytest.raises(ProCapError, match=clevr_pairs[1].after_path.name):
        prepare(prepare_options(tmp_path, clevr_pairs), clevr_pairs, interpolator=CrossFade())


def test_size_mismatch_names_the_pair(tmp_path, clevr_pairs):
    from PIL import Image

    Image.new("RGB", (20, 24)).save(clevr_pairs[0].after_path)
    with pytest.raises(ProCapError, match=f"pair {clevr_pairs[0].id}"):
        prepare(prepare_options(tmp_path, clevr_pairs), clevr_pairs, interpolator=CrossFade())
    opts = prepare_options(tmp_path, clevr_pairs, allow_size_mismatch=True)
    assert prepare(opts, clevr_pairs, interpolator=CrossFade())["written"] == 6


def test_option_errors(tmp_path, clevr_pairs):
    with pytest.raises(ProCapError, match="--vqgan"):
        prepare(prepare_options(tmp_path, clevr_pairs, similarity="vqgan", scores_file=None), clevr_pairs)
    with pytest.raises(ProCapError, match="--dinov2-weights"):
        prepare(prepare_options(tmp_path, clevr_pairs, similarity="dinov2", scores_file=None), clevr_pairs)
    with pytest.raises(ProCapError, match="no entry for pair"):
        prepare(prepare_options(tmp_path, clevr_pairs[:1]), clevr_pairs)  # score file covers one pair only
    with pytest.raises(ValueError, match="generated frames"):
        prepare(prepare_options(tmp_path, clevr_pairs, num_generated=4), clevr_pairs)


def test_resume_with_other_settings_is_refused(tmp_path, clevr_pairs):
    prepare(prepare_options(tmp_path, clevr_pairs[:1]), clevr_pairs[:1], interpolator=CrossFade())
    with pytest.raises(ProCapError, match="image_size"):
        prepare(prepare_options(tmp_path, clevr_pairs[:1], image_size=48), clevr_pairs[:1], interpolator=CrossFade())


def test_cli_reports_bad_workers(tmp_path, capsys):
    from procap.commands.cli import main

    (tmp_path / "data").mkdir()
    argv = ["--root", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--workers", "0"]
    code = main(["prepare", "--dataset", "clevr-change", *argv])
    assert code == 2 and "--workers" in capsys.readouterr().err


def test_cli_on_a_synthetic_benchmark(tmp_path, capsys):
    """`procap synth` output through load_split into `procap prepare`, then read back for stage 1."""
    from procap.commands.cli import main
    from procap.data import load_split
    from procap.data.synthetic import generate
    from procap.train.vqgan_train import save_vqgan
    from tests.support import tiny_vqgan

    generate(tmp_path / "synth", 5, size=32, seed=0, progress=False)
    save_vqgan(tmp_path / "vq.safetensors", tiny_vqgan())
    args = [
        "prepare",
        "--dataset",
        "clevr-change",
        "--root",
        str(tmp_path / "synth"),
        "--out",
        str(tmp_path / "c"),
        "--size",
        "32",
        "--frames",
        "3",
        "--vqgan",
        str(tmp_path / "vq.safetensors"),
        "--no-progress",
    ]
    assert main(args) == 0
    pairs = load_split("clevr-change", tmp_path / "synth", "train")
    assert f"{len(pairs)} pairs written" in capsys.readouterr().out
    source = CachedProcedures(tmp_path / "c", 1)
    frames = source(pairs[0], None, None)
    assert frames.shape == (3, 3, 32, 32)
    source.close()


def test_resume_with_an_input_file_of_other_content_under_the_same_name_is_refused(tmp_path, clevr_pairs):
    """The manifest records each model / score file by content: a file replaced under its old name would mix
    two tokenizers' (or two scorers') outputs in one cache with exit 0."""
    opts = prepare_options(tmp_path, clevr_pairs[:1])
    prepare(opts, clevr_pairs[:1], interpolator=CrossFade())
    Path(opts.scores_file).write_text(Path(opts.scores_file).read_text().replace("1.0", "0.9"))
    with pytest.raises(ProCapError, match="--scores-file file of other content"):
        prepare(opts, clevr_pairs[:1], interpolator=CrossFade())
    vqgan = tmp_path / "vq.safetensors"  # the VQGAN is recorded the same way (its name alone was before)
    vqgan.write_bytes(b"one")
    first = prepare_options(tmp_path, clevr_pairs, vqgan=str(vqgan)).content_key()
    vqgan.write_bytes(b"two")
    second = prepare_options(tmp_path, clevr_pairs, vqgan=str(vqgan)).content_key()
    assert first["vqgan"] == second["vqgan"] and first["vqgan_sha256"] != second["vqgan_sha256"]


def test_resume_with_the_same_input_file_under_another_name_is_accepted(tmp_path, clevr_pairs):
    """The content decides, not the name: a score file (or VQGAN) copied or renamed resumes its cache, and a file of
    other content under a new name is still refused."""
    import shutil

    opts = prepare_options(tmp_path, clevr_pairs[:2])
    assert prepare(opts, clevr_pairs[:1], interpolator=CrossFade())["written"] == 1
    renamed = tmp_path / "elsewhere" / "scores renamed.json"
    renamed.parent.mkdir()
    shutil.copyfile(opts.scores_file, renamed)
    resumed = prepare_options(tmp_path, clevr_pairs[:2], scores_file=str(renamed))
    assert prepare(resumed, clevr_pairs[:2], interpolator=CrossFade()) == {"written": 1, "skipped": 1, "total": 2}
    other = tmp_path / "other.json"
    other.write_text(Path(opts.scores_file).read_text().replace("1.0", "0.9"))
    with pytest.raises(ProCapError, match="--scores-file file of other content"):
        prepare(prepare_options(tmp_path, clevr_pairs[:2], scores_file=str(other)), clevr_pairs[:2], CrossFade())


def test_a_full_disk_stops_prepare_with_one_sentence_before_hdf5_fails(tmp_path, clevr_pairs, monkeypatch):
    """HDF5 cannot recover from ENOSPC (its exit handler may crash), so each pair's space is checked first;
    the finished pairs stay and a rerun completes the cache."""
    import shutil

    from procap.core.files import OutputError

    opts = prepare_options(tmp_path, clevr_pairs)
    real_usage = shutil.disk_usage
    writes = []

    def filling_disk(path):
        writes.append(path)
        usage = real_usage(path)
        return usage._replace(free=0) if len(writes) > 2 else usage

    monkeypatch.setattr(shutil, "disk_usage", filling_disk)
    with pytest.raises(OutputError, match="No space left") as failure:
        prepare(opts, clevr_pairs, interpolator=CrossFade())
    assert failure.value.filename.endswith(".h5")
    monkeypatch.setattr(shutil, "disk_usage", real_usage)
    assert prepare(opts, clevr_pairs, interpolator=CrossFade()) == {"written": 4, "skipped": 2, "total": 6}
    validate(tmp_path / "cache", clevr_pairs)


def test_resume_after_the_dataset_images_changed_is_refused(tmp_path, clevr_pairs):
    """Each pair records the images it was built from; a resumed run refuses a finished pair whose image now has
    other content under the same name (it would keep frames of the old image beside pairs of the new ones)."""
    import shutil

    from PIL import Image

    opts = prepare_options(tmp_path, clevr_pairs)
    assert prepare(opts, clevr_pairs[:2], interpolator=CrossFade())["written"] == 2
    changed = clevr_pairs[1].after_path
    copy = tmp_path / "copy.png"
    shutil.copy(changed, copy)
    os.replace(copy, changed)  # the same bytes, a new modification time: hashed again and kept
    assert prepare(opts, clevr_pairs[:3], interpolator=CrossFade()) == {"written": 1, "skipped": 2, "total": 3}
    Image.new("RGB", (32, 32), (200, 30, 30)).save(changed)  # other pixels under the same file name
    with pytest.raises(ProCapError, match=f"image {changed} changed since cache .* was built from it") as info:
        prepare(opts, clevr_pairs, interpolator=CrossFade())
    assert clevr_pairs[1].id in str(info.value)
    changed.unlink()
    with pytest.raises(ProCapError, match=f"image {changed} of pair .* no longer exists"):
        prepare(opts, clevr_pairs, interpolator=CrossFade())


def test_a_pair_cached_without_a_record_of_its_images_is_refused_on_resume(tmp_path, clevr_pairs):
    opts = prepare_options(tmp_path, clevr_pairs)
    prepare(opts, clevr_pairs[:1], interpolator=CrossFade())
    with h5py.File(tmp_path / "cache" / "sc_videos.h5", "a") as f:
        record = json.loads(f["000000.png"].attrs["source"])
        assert [entry[0] for entry in (record["before"], record["after"])] == [
            clevr_pairs[0].before_path.name,
            clevr_pairs[0].after_path.name,
        ]
        del f["000000.png"].attrs["source"]  # as a cache written before the record existed
    with pytest.raises(ProCapError, match="without a record of the images it was built from"):
        prepare(opts, clevr_pairs, interpolator=CrossFade())
