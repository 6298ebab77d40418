"""`procap prepare` argument checks: one-sentence errors with exit code 2 before any work starts."""

from __future__ import annotations

import pytest

from procap.commands.cli import main


@pytest.mark.parametrize(
    "extra,message",
    [(["--workers", "0"], "--workers must be at least 1"), (["--size", "8"], "--size must be at least 16")],
)
def test_bad_numbers(tmp_path, capsys, extra, message):
    (tmp_path / "data").mkdir()
    argv = ["prepare", "--dataset", "clevr-change", "--root", str(tmp_path / "data"), "--out", str(tmp_path / "c")]
    argv += extra
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "c").exists()


def test_unknown_dataset_is_refused_by_the_parser(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", "--dataset", "coco", "--root", str(tmp_path), "--out", str(tmp_path / "c")])
    assert exit_info.value.code == 2
