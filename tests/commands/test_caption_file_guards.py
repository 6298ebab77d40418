"""`procap caption --out` is one run's work (issue 48): a killed `--overwrite` leaves the old file whole, a second
writer is refused naming the first, and `--resume` with another checkpoint or other decoding settings is refused.

Kills are ``os._exit`` right after a named write (the first batch appended) in a child process, as ``kill -9``:
no cleanup runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from procap.commands.cli import main
from procap.core.files import OutputLock
from procap.fast.caption_file import CaptionFile
from tests.support import run_caption, subprocess_env

ROOT = Path(__file__).resolve().parents[2]
KILLED = 86

# the child: `procap caption ARGV` stopped outright once its first batch is appended
_KILLED_AFTER_FIRST_BATCH = """
import os, sys
from procap.commands.cli import main
from procap.fast import caption_file

append = caption_file.CaptionFile.append

def append_then_die(self, rows):
    append(self, rows)
    os._exit(KILLED)

caption_file.CaptionFile.append = append_then_die
main(sys.argv[1:])
""".replace("KILLED", str(KILLED))


def _source(folders) -> list[str]:
    before_dir, after_dir = folders
    return ["--before-dir", str(before_dir), "--after-dir", str(after_dir)]


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_an_overwrite_killed_after_its_first_batch_leaves_the_old_file_whole(checkpoint, folders, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    assert run_caption(checkpoint, *_source(folders), "--out", str(out)) == 0
    old = out.read_bytes()
    argv = ["caption", "--ckpt", str(checkpoint), "--device", "cpu", "--batch-size", "2", *_source(folders)]
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_FIRST_BATCH, *argv, "--out", str(out), "--overwrite", "--max-len", "4"],
        cwd=ROOT,
        env=subprocess_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert killed.returncode == KILLED, killed.stderr[-3000:]
    assert out.read_bytes() == old  # all 5 rows, not the 2 of the killed run's first batch
    assert ".captions.jsonl.saving" in _hidden(tmp_path)  # what the kill left: the unfinished replacement

    capsys.readouterr()
    assert run_caption(checkpoint, *_source(folders), "--out", str(out), "--resume") == 0
    assert "deleted an unfinished save" in capsys.readouterr().err
    assert out.read_bytes() == old and _hidden(tmp_path) == [".captions.jsonl.settings.json"]

    assert run_caption(checkpoint, *_source(folders), "--out", str(out), "--overwrite", "--max-len", "4") == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    assert json.loads((tmp_path / ".captions.jsonl.settings.json").read_text())["decoding"]["--max-len"] == 4
    assert _hidden(tmp_path) == [".captions.jsonl.settings.json"]


def test_a_second_writer_is_refused_naming_the_first(checkpoint, folders, tmp_path, capsys):
    out = tmp_path / "captions.jsonl"
    with CaptionFile(out):  # a run writing the file (the lock is per open file, so this process counts as another)
        for extra in ([], ["--overwrite"], ["--resume"]):
            assert run_caption(checkpoint, *_source(folders), "--out", str(out), *extra) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"procap: error: --out {out} is being written by procap (pid {os.getpid()}:")
            assert err.count("\n") == 1 and not out.exists()
    assert _hidden(tmp_path) == []  # the lock file goes with its holder
    assert run_caption(checkpoint, *_source(folders), "--out", str(out)) == 0


def test_the_lock_file_of_a_killed_writer_is_taken_over(tmp_path):
    out = tmp_path / "captions.jsonl"
    lock = OutputLock(out).lock_file
    lock.write_text("procap (pid 1: a run killed long ago)")  # its flock went with its process
    with OutputLock(out):
        assert "pid" in lock.read_text() and str(os.getpid()) in lock.read_text()
    assert not lock.exists()


def _partial(checkpoint, folders, tmp_path, *settings: str) -> Path:
    """A caption file cut after its first two rows, as a stopped run leaves it."""
    out = tmp_path / "captions.jsonl"
    assert run_caption(checkpoint, *_source(folders), "--out", str(out), *settings) == 0
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:2]))
    return out


@pytest.mark.parametrize(
    ("first", "resumed", "named"),
    [
        ([], ["--max-len", "4"], "--max-len 16, not 4"),  # the checkpoint's own max_caption_len, 16, was used
        (["--beams", "2"], [], '--strategy "beam", not "greedy"'),
        (["--beams", "2"], ["--beams", "2", "--length-penalty", "0.5"], "--length-penalty 1.0, not 0.5"),
        (["--strategy", "sample"], [], '--strategy "sample", not "greedy"'),
        (["--strategy", "sample", "--seed", "1"], ["--strategy", "sample", "--seed", "2"], "--seed 1, not 2"),
        (["--strategy", "sample", "--top-p", "0.9"], ["--strategy", "sample"], "--top-p 0.9, not 1.0"),
    ],
)
def test_resume_with_other_decoding_settings_is_refused(checkpoint, folders, tmp_path, capsys, first, resumed, named):
    out = _partial(checkpoint, folders, tmp_path, *first)
    kept = out.read_bytes()
    capsys.readouterr()
    assert run_caption(checkpoint, *_source(folders), "--out", str(out), "--resume", *resumed) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"procap: error: --resume: {out} was captioned with {named}") and err.count("\n") == 1
    assert out.read_bytes() == kept


def test_resume_with_the_same_settings_given_explicitly_goes_on(checkpoint, folders, tmp_path, capsys):
    out = _partial(checkpoint, folders, tmp_path)
    assert run_caption(checkpoint, *_source(folders), "--out", str(out), "--resume", "--max-len", "16") == 0
    assert len(out.read_text().splitlines()) == 5


def test_a_sampled_file_records_its_strategy_and_resumes_with_it(checkpoint, folders, tmp_path, capsys):
    sampling = ["--strategy", "sample", "--temperature", "0.8", "--seed", "9"]
    out = _partial(checkpoint, folders, tmp_path, *sampling)
    recorded = json.loads((tmp_path / ".captions.jsonl.settings.json").read_text())["decoding"]
    assert recorded == {
        "--max-len": 16,
        "--strategy": "sample",
        "--temperature": 0.8,
        "--top-k": 0,
        "--top-p": 1.0,
        "--seed": 9,
    }
    assert run_caption(checkpoint, *_source(folders), "--out", str(out), "--resume", *sampling, "--top-k", "0") == 0
    assert len(out.read_text().splitlines()) == 5


def test_resume_with_another_checkpoint_is_refused(checkpoint, folders, tmp_path, capsys):
    out = _partial(checkpoint, folders, tmp_path)
    kept = out.read_bytes()
    other = tmp_path / "retrained.safetensors"
    from safetensors import safe_open

    with safe_open(str(checkpoint), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(checkpoint)
    first = next(iter(tensors))
    save_file({**tensors, first: tensors[first] + 1}, str(other), metadata=metadata)
    capsys.readouterr()
    assert (
        main(["caption", "--ckpt", str(other), "--device", "cpu", *_source(folders), "--out", str(out), "--resume"])
        == 2
    )
    err = capsys.readouterr().err
    assert f"--resume: {out} was captioned with the checkpoint {checkpoint.resolve()}" in err
    assert f"not {other.resolve()}" in err and err.count("\n") == 1 and out.read_bytes() == kept


def test_a_file_without_recorded_settings_is_resumed_with_a_note(checkpoint, folders, tmp_path, capsys):
    out = _partial(checkpoint, folders, tmp_path)
    (tmp_path / ".captions.jsonl.settings.json").unlink()  # written by an older procap
    capsys.readouterr()
    assert run_caption(checkpoint, *_source(folders), "--out", str(out), "--resume") == 0
    assert "records no checkpoint or decoding settings" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 5
    assert (tmp_path / ".captions.jsonl.settings.json").is_file()  # from now on it does
