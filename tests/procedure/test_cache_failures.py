"""A procedure cache survives a failed or killed write (issue 48, class D): under a file-size limit `procap prepare`
stops with one sentence (it segfaulted at exit and left a group file the next run refused), and a run killed while
a group file is written anew keeps every pair; a re-run continues in both cases.

Each `prepare` runs in a child process: the limit (``RLIMIT_FSIZE``, SIGXFSZ ignored as Python does) and the kill
(``os._exit`` at a named write) must not reach the test's own process.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from procap.commands.cli import main
from procap.core.files import OutputError
from procap.procedure.cache import CachedProcedures, pending_folder, stored_sources, write_group_file
from tests.support import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
KILLED = 86
GROUPS = ["sc_videos", "nsc_videos"]

# the child: `procap prepare ARGV` with an optional file-size limit, optionally without the check before each write
# (a quota shows only when it is met: then the write itself fails), optionally stopped outright at the rename that
# puts a rewritten group file in place
_CHILD = """
import os, resource, sys
limit, unchecked, kill_at_rename = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
from procap.commands.cli import main
from procap.core import files
if unchecked:
    files.file_size_limit = lambda: None
if kill_at_rename:
    replace = os.replace
    def replace_or_die(source, target):
        if os.path.basename(target) in ("sc_videos.h5", "nsc_videos.h5"):
            os._exit(KILLED)
        replace(source, target)
    os.replace = replace_or_die
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(main(sys.argv[4:]))
""".replace("KILLED", str(KILLED))


@pytest.fixture
def synth_root(tmp_path) -> Path:
    from procap.data.synthetic import generate
    from procap.train.vqgan_train import save_vqgan
    from tests.support import tiny_vqgan

    generate(tmp_path / "synth", 5, size=32, seed=0, progress=False)
    save_vqgan(tmp_path / "synth" / "vq.safetensors", tiny_vqgan())
    return tmp_path / "synth"


def _argv(synth_root: Path, out: Path) -> list[str]:
    return [
        "prepare",
        *("--dataset", "clevr-change", "--root", str(synth_root), "--out", str(out)),
        *("--size", "32", "--frames", "3", "--vqgan", str(synth_root / "vq.safetensors"), "--no-progress"),
    ]


def _child(argv: list[str], limit: int = 0, unchecked: bool = False, kill_at_rename: bool = False):
    flags = [str(limit), str(int(unchecked)), str(int(kill_at_rename))]
    return subprocess.run(
        [sys.executable, "-c", _CHILD, *flags, *argv],
        cwd=ROOT,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _readable(out: Path) -> int:
    """The pairs of the finished cache, each read back as stage 1 reads it."""
    count = 0
    for group in GROUPS:
        with h5py.File(out / f"{group}.h5", "r") as handle:
            keys = list(handle)
            assert all(handle[key].attrs["complete"] == 1 for key in keys)
            count += len(keys)
    source = CachedProcedures(out, 1)
    source.close()
    return count


@pytest.mark.parametrize("unchecked", [False, True], ids=["checked-before", "met-by-the-write"])
def test_a_file_size_limit_is_one_sentence_and_the_rerun_continues(synth_root, tmp_path, capsys, unchecked):
    out = tmp_path / "cache"
    # one pair's file (about 17 KB) fits; a group file of three pairs does not
    limited = _child(_argv(synth_root, out), limit=30_000, unchecked=unchecked)
    assert limited.returncode == 2, limited.stderr[-2000:]  # not -11: no segfault, at exit or before
    said = [line for line in limited.stderr.splitlines() if line.startswith("procap:")]  # not the kernels' warning
    assert len(said) == 1 and "Traceback" not in limited.stderr, limited.stderr[-2000:]
    assert said[0].startswith("procap: error: cannot write ") and said[0].endswith(".h5 (File too large).")
    committed = len(stored_sources(out, GROUPS))
    assert committed >= 1  # the pairs written before the limit was met are kept, pending a rewrite of their group

    assert main(_argv(synth_root, out)) == 0
    printed = capsys.readouterr().out
    assert f"{committed} already done" in printed
    assert _readable(out) == int(printed.split(" pairs written")[0].split()[-1]) + committed
    assert not any(pending_folder(out, group).exists() for group in GROUPS)


def test_a_kill_between_the_rewrite_of_a_group_file_and_its_rename_keeps_every_pair(synth_root, tmp_path, capsys):
    out = tmp_path / "cache"
    killed = _child(_argv(synth_root, out), kill_at_rename=True)
    assert killed.returncode == KILLED, killed.stderr[-2000:]
    assert not (out / "sc_videos.h5").exists() and not (out / "nsc_videos.h5").exists()
    assert list(out.glob(".*.h5.*.tmp"))  # the complete rewrite the kill kept from its place
    committed = len(stored_sources(out, GROUPS))
    assert committed >= 2

    assert main(_argv(synth_root, out)) == 0
    assert f"0 pairs written, {committed} already done" in capsys.readouterr().out
    assert _readable(out) == committed
    assert not list(out.glob(".*.tmp")) and not any(pending_folder(out, group).exists() for group in GROUPS)


def test_a_failed_group_rewrite_leaves_the_file_in_place_and_names_it(tmp_path, monkeypatch):
    """The child process meets the limit, this process reports it: the group file and this process's HDF5 are
    untouched (an in-place write crashed the interpreter at its next flush)."""
    source = tmp_path / "pair.h5"
    with h5py.File(source, "w") as handle:
        handle.create_dataset("k", data=np.arange(50_000, dtype=np.uint8)).attrs["complete"] = 1
    final = tmp_path / "sc_videos.h5"
    final.write_bytes(b"old")
    monkeypatch.setattr("procap.core.files.file_size_limit", lambda: None)  # as a quota: seen only when met
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    try:
        with pytest.raises(OutputError, match="File too large") as failure:
            write_group_file(final, [(source, ["k"])])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert failure.value.filename == str(final)
    assert final.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["pair.h5", "sc_videos.h5"]
    write_group_file(final, [(source, ["k"])])
    with h5py.File(final, "r") as handle:
        assert list(handle) == ["k"] and handle["k"].shape == (50_000,)


def test_a_second_writer_of_a_cache_is_refused_naming_the_first(tmp_path):
    from procap.core.errors import ProCapError
    from procap.procedure.cache import CacheWriter

    writer = CacheWriter(tmp_path / "cache")
    try:
        with pytest.raises(ProCapError, match=f"in use by another procap run \\(pid {os.getpid()}: "):
            CacheWriter(tmp_path / "cache")
    finally:
        writer.close()
    CacheWriter(tmp_path / "cache").close()  # released
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir())) == '["cache"]'
