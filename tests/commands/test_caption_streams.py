"""Bytes as they are (issue 48, class F): image and output names the OS gives in bytes that are no UTF-8 are carried
through and written as they are (caption --out crashed after the work), and captions to a closed stdout are one
sentence, exit 2, where with --out nothing is lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import run_caption, subprocess_env

ROOT = Path(__file__).resolve().parents[2]
NOT_UTF8 = os.fsdecode(b"caf\xe9")  # a Latin-1 name, as Python holds it: a surrogate escape for the byte 0xe9


def _rename_first_pair(before_dir: Path, after_dir: Path) -> str:
    name = f"{NOT_UTF8}.png"
    for folder in (before_dir, after_dir):
        os.rename(folder / "pair0.png", folder / name)
    return name


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_names_that_are_not_utf8_are_written_as_the_os_gave_them(checkpoint, folders, tmp_path, monkeypatch, suffix):
    before_dir, after_dir = folders
    name = _rename_first_pair(before_dir, after_dir)
    out = tmp_path / f"{NOT_UTF8}{suffix}"
    monkeypatch.setattr(sys, "argv", ["procap", "caption", "--out", str(out)])  # the lock records the command line
    source = ["--before-dir", str(before_dir), "--after-dir", str(after_dir)]
    assert run_caption(checkpoint, *source, "--out", str(out)) == 0
    written = os.fsencode(out)
    assert os.path.basename(written) == b"caf\xe9" + suffix.encode()
    data = Path(written.decode("utf-8", "surrogateescape")).read_bytes()
    assert os.fsencode(before_dir / name) in data and os.fsencode(after_dir / name) in data  # the OS's bytes
    assert data.count(b"\n") == 5 + (suffix == ".csv")
    # resumed, the file's bytes name the same images: nothing is captioned twice
    assert run_caption(checkpoint, *source, "--out", str(out), "--resume") == 0
    assert Path(out).read_bytes() == data


def _closed_stdout_run(argv: list[str]) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -0`: the reader is gone before the first caption
    try:
        return subprocess.run(
            [sys.executable, "-m", "procap", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=subprocess_env(OMP_NUM_THREADS="1"),
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)


def test_captions_to_a_closed_stdout_are_one_sentence_and_with_out_nothing_is_lost(checkpoint, folders, tmp_path):
    before_dir, after_dir = folders
    argv = ["caption", "--ckpt", str(checkpoint), "--device", "cpu", "--batch-size", "2", "--no-progress"]
    argv += ["--before-dir", str(before_dir), "--after-dir", str(after_dir)]
    printed = _closed_stdout_run(argv)
    err = printed.stderr.decode()
    said = [line for line in err.splitlines() if line.startswith("procap:")]  # not the kernels' warnings
    assert printed.returncode == 2 and "Traceback" not in err and "Exception ignored" not in err, err[-2000:]
    sentence = (
        "procap: error: stdout was closed before the captions were all written (its reader went away); give --out "
        "FILE to keep them."
    )
    assert said == [sentence]

    out = tmp_path / "captions.jsonl"
    kept = _closed_stdout_run([*argv, "--out", str(out)])
    assert kept.returncode == 0, kept.stderr.decode()[-2000:]
    assert len(out.read_text().splitlines()) == 5
