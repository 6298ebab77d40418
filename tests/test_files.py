"""procap.files: atomic writes leave no temporary file and give the result an ordinary file mode."""

from __future__ import annotations

import os
import stat

import pytest

from procap.files import atomic_write, atomic_write_json, atomic_write_text


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
