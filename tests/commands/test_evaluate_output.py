"""`procap evaluate` takes `--progress` / `--no-progress` like the other commands, and refuses an `--out` folder that
holds an evaluation unless `--overwrite` is given, as `procap caption` refuses an existing `--out`."""

from __future__ import annotations

import json

import pytest
import torch

from procap.commands.cli import main
from procap.data import load_split
from procap.data.synthetic import generate
from procap.eval.metrics import EVALUATION_FILES
from procap.loading.checkpoint import save_checkpoint
from procap.model.procap import ProCap
from procap.train.common import build_vocab
from tests.support import small_config, small_vqgan_config


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A 12-scene synthetic benchmark at 16 px and an untrained small checkpoint of its vocabulary."""
    root = tmp_path_factory.mktemp("evaluate_out")
    generate(root / "data", 12, size=16, seed=0, workers=1, progress=False)
    vocab = build_vocab(load_split("clevr-change", root / "data", "train"), "clevr-change")
    torch.manual_seed(0)
    config = small_config(vqgan=small_vqgan_config(ch_mult=(1, 2), attn_resolutions=()), vocab_size=len(vocab))
    return root, save_checkpoint(root / "model.safetensors", ProCap(config).eval(), vocab)


def _evaluate(bench, out, *flags: str) -> int:
    root, ckpt = bench
    argv = ["evaluate", "--ckpt", str(ckpt), "--data", str(root / "data"), "--metrics", "BLEU-4", "--device", "cpu"]
    return main([*argv, "--out", str(out), *flags])


def test_an_evaluation_in_out_is_refused_without_overwrite(bench, tmp_path, capsys):
    out = tmp_path / "eval"
    assert _evaluate(bench, out, "--max-pairs", "2", "--no-progress") == 0
    written = {name: (out / name).read_bytes() for name in EVALUATION_FILES}
    capsys.readouterr()

    assert _evaluate(bench, out, "--max-pairs", "3", "--no-progress") == 2
    err = capsys.readouterr().err
    assert err == (
        f"procap: error: --out {out} already holds an evaluation ({', '.join(EVALUATION_FILES)}); add --overwrite "
        "to replace it, or give another --out.\n"
    )
    assert {name: (out / name).read_bytes() for name in EVALUATION_FILES} == written  # nothing was touched

    assert _evaluate(bench, out, "--max-pairs", "3", "--no-progress", "--overwrite") == 0
    assert json.loads((out / "metrics.json").read_text())["pairs"] == 3


def test_one_file_of_an_evaluation_is_enough_to_refuse(bench, tmp_path, capsys):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    assert _evaluate(bench, out, "--max-pairs", "2") == 2
    assert "already holds an evaluation (metrics.json)" in capsys.readouterr().err
    other = tmp_path / "other"  # a folder holding other files only is written into
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert _evaluate(bench, other, "--max-pairs", "2", "--no-progress") == 0
    assert (other / "notes.txt").read_text() == "mine" and (other / "metrics.json").is_file()


@pytest.mark.parametrize("flag", ["--progress", "--no-progress", None])
def test_the_progress_bar_follows_the_flag(bench, tmp_path, capsys, flag):
    flags = ["--max-pairs", "3", "--batch-size", "1"] + ([flag] if flag else [])
    assert _evaluate(bench, tmp_path / "eval", *flags) == 0
    err = capsys.readouterr().err
    assert ("caption:" in err) is (flag != "--no-progress"), err  # on by default, as in the other commands
