"""`procap convert --dataset` records what the authors' weights were trained on; without it the domain is unknown."""

from __future__ import annotations

from procap.commands.cli import main
from procap.data.domain import TRAINED_ON, read_domain
from procap.loading.checkpoint import read_checkpoint_metadata
from tests.support import AUTHORS_CHECKPOINT, AUTHORS_VOCAB


def _convert(out, capsys, *dataset: str) -> tuple[dict, str]:
    argv = ["convert", "--from", "authors", str(AUTHORS_CHECKPOINT), "--vocab", str(AUTHORS_VOCAB), *dataset]
    assert main([*argv, "--out", str(out)]) == 0
    return read_checkpoint_metadata(out)["extra"], capsys.readouterr().out


def test_convert_records_the_dataset_only_when_given(tmp_path, capsys):
    extra, printed = _convert(tmp_path / "known.safetensors", capsys, "--dataset", "spot-the-diff")
    assert read_domain(extra) == {
        "dataset": "spot-the-diff",
        "synthetic": False,
        "title": "Spot-the-Diff",
        "data": None,  # the authors' data folder is not known here
        "image_size": 224,
        "source_image_size": None,  # its images vary in size: no size to compare with
        "preset": None,
    }
    assert "trained on: Spot-the-Diff, model input 224 px" in printed

    extra, printed = _convert(tmp_path / "unknown.safetensors", capsys)
    assert TRAINED_ON not in extra and read_domain(extra) is None and "trained on: unknown" in printed
