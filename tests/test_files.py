"""procap.core.files: atomic writes leave no temporary file and give the result an ordinary file mode; operating-system
failures name the output; inputs of a running command are never overwritten."""

from __future__ import annotations

import errno
import os
import stat
import threading

import pytest
from safetensors import SafetensorError

from procap.core.errors import ProCapError
from procap.core.files import (
    OutputError,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    input_overlap,
    os_error_in,
    protect_inputs,
    require_space,
    writing,
)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_file_gets_the_umask_mode_not_mkstemps_0600(tmp_path, umask_022):
    out = atomic_write_json(tmp_path / "metrics.json", {"a": 1})
    assert mode(out) == 0o644


def test_umask_is_respected_and_left_unchanged(tmp_path):
    old = os.umask(0o077)
    try:
        out = atomic_write_text(tmp_path / "private.txt", "x")
        assert mode(out) == 0o600
        assert os.umask(0o077) == 0o077  # the write put the caller's umask back
    finally:
        os.umask(old)


def test_replacing_a_file_keeps_its_mode(tmp_path, umask_022):
    target = tmp_path / "report.txt"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and mode(target) == 0o640


def test_failed_writer_leaves_nothing(tmp_path):
    def broken(tmp: str) -> None:
        with open(tmp, "w") as handle:
            handle.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "out.bin", broken)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_removes_the_folders_it_created_and_names_the_output(tmp_path):
    """Disk full inside the writer: an OutputError naming the final file (not the temporary one), and the
    folders made for it are gone again (`procap score --out new/dir/s.json` used to leave new/dir behind)."""
    target = tmp_path / "new" / "dir" / "scores.json"

    def full(tmp: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what write() raises: no file name

    with pytest.raises(OutputError) as failure:
        atomic_write(target, full)
    assert failure.value.filename == str(target) and failure.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
        RuntimeError("Can't decrement id ref count (file write failed: errno = 28, error message = 'No space')"),
    ],
    ids=["OSError", "safetensors", "h5py"],
)
def test_os_failures_of_any_library_name_the_output(tmp_path, error):
    assert os_error_in(error) == (errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(OutputError, match="No space left") as failure, writing(tmp_path / "cache.h5"):
        raise error
    assert failure.value.filename == str(tmp_path / "cache.h5")


def test_other_errors_pass_through_writing(tmp_path):
    with pytest.raises(ValueError), writing(tmp_path / "x"):
        raise ValueError("a bug, not a full disk")


def test_inputs_are_never_overwritten(tmp_path):
    """Same path, a symlink, a hard link or a place inside an input folder: refused before anything is written."""
    refs = tmp_path / "refs.json"
    refs.write_text("{}")
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "hard.json").hardlink_to(refs)
    (tmp_path / "soft.json").symlink_to(refs)
    inputs = [("--refs", refs), ("--root", data)]
    with protect_inputs(inputs):
        for output in (refs, tmp_path / "hard.json", tmp_path / "soft.json", data / "vocab.json", data):
            with pytest.raises(ProCapError, match="which this command reads|a folder this command reads"):
                atomic_write_text(output, "scores")
        atomic_write_text(tmp_path / "scores.json", "fine")
    assert refs.read_text() == "{}" and sorted(p.name for p in data.iterdir()) == []
    atomic_write_text(data / "vocab.json", "{}")  # outside a command's run nothing is protected
    assert input_overlap(tmp_path / "other.json", inputs) is None


def test_require_space(tmp_path, monkeypatch):
    import shutil

    require_space(tmp_path / "a" / "b.h5", 1)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 10, 0))
    with pytest.raises(OutputError, match="No space left") as failure:
        require_space(tmp_path / "a" / "b.h5", 1)
    assert failure.value.filename == str(tmp_path / "a" / "b.h5")


def _read_fifo(path, into: list) -> threading.Thread:
    def read():
        with open(path, "rb") as handle:
            into.append(handle.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_an_output_that_is_a_pipe_is_written_through_not_replaced(tmp_path):
    """A rename onto a named pipe or a device (``--out /dev/stdout``, ``/dev/null``) replaced it with a file."""
    from procap.core.files import atomic_write_text, is_stream

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    assert is_stream(fifo) and is_stream(link) and not is_stream(tmp_path) and not is_stream(tmp_path / "none")
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    atomic_write_text(link, "through the pipe\n")
    reader.join(10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "pipe"]  # no temporary file left beside it


def test_score_out_to_a_pipe(tmp_path, capsys):
    import json

    from procap.commands.cli import main

    (tmp_path / "p.json").write_text(json.dumps({"p1": "the cube moved"}))
    (tmp_path / "r.json").write_text(json.dumps({"p1": ["the cube moved"]}))
    fifo = tmp_path / "scores"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    argv = ["score", "--pred", str(tmp_path / "p.json"), "--refs", str(tmp_path / "r.json"), "--metrics", "bleu"]
    assert main([*argv, "--out", str(fifo)]) == 0
    reader.join(10)
    assert "BLEU-4" in json.loads(got[0]) and stat.S_ISFIFO(os.stat(fifo).st_mode)


# -- names at the file system's limit -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a" * 250 + ".json", "é" * 125 + ".txt", "b" * 242], ids=["255", "254 utf-8", "242"])
def test_a_legal_name_up_to_the_limit_is_written(tmp_path, name):
    """Temporary names were the output's plus 14 bytes: a legal 242-255-byte name failed after the work was done."""
    from procap.core.files import name_limit, temp_prefix

    assert len(name.encode()) <= name_limit(tmp_path)
    target = tmp_path / name
    atomic_write_text(target, "content")
    assert target.read_text() == "content"
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left beside it
    prefix = temp_prefix(name, tmp_path)
    assert len(prefix.encode()) + 8 + len(".tmp") <= name_limit(tmp_path)
    prefix.encode("utf-8")  # cut at a character boundary: still valid text


def test_a_checkpoint_under_a_255_byte_name_is_written(tmp_path):
    import torch

    from procap.core.weights import atomic_save_tensors, read_tensors

    target = tmp_path / ("c" * 243 + ".safetensors")
    atomic_save_tensors(target, {"w": torch.ones(2)})
    assert torch.equal(read_tensors(target)[0]["w"], torch.ones(2))


def test_require_space_sees_the_file_size_limit_as_well_as_free_space(tmp_path):
    """Under ``RLIMIT_FSIZE`` a write fails with EFBIG however much the disk has free: the check says so first,
    for the size the file will have."""
    import resource

    target = tmp_path / "sc_videos.h5"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, hard))
    try:
        require_space(target, 50_000, file_bytes=10_000)  # free space is not what the limit bounds
        with pytest.raises(OutputError, match="File too large") as failure:
            require_space(target, 1, file_bytes=10_001)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert failure.value.errno == errno.EFBIG and failure.value.filename == str(target)
    require_space(target, 1, file_bytes=10**12)  # no limit: no check


WRITE_REFUSALS = {
    errno.ENOSPC: "No space left on device",
    errno.EDQUOT: "Disk quota exceeded",
    errno.EFBIG: "File too large",
    errno.EROFS: "Read-only file system",
}


@pytest.mark.parametrize("number", sorted(WRITE_REFUSALS), ids=[errno.errorcode[n] for n in sorted(WRITE_REFUSALS)])
@pytest.mark.parametrize("library", ["python", "safetensors", "h5py"])
def test_every_refusal_of_a_write_names_the_output(tmp_path, number, library):
    """Disk full, quota, file-size limit and a read-only file system are one failure, met by any library."""
    raised = {
        "python": OSError(number, os.strerror(number), str(tmp_path / ".out.json.x1y2z3.tmp")),
        "safetensors": SafetensorError(f"I/O error: {os.strerror(number)} (os error {number})"),
        "h5py": RuntimeError(f"Can't write data (file write failed: errno = {number}, error message = '...')"),
    }[library]
    with pytest.raises(OutputError) as failure, writing(tmp_path / "out.json"):
        raise raised
    assert (failure.value.errno, failure.value.strerror) == (number, os.strerror(number))
    assert failure.value.filename == str(tmp_path / "out.json")
