"""Checks before work: a missing optional extra or a VQGAN batch that cannot fit fails within the first second,
in one sentence, before any data is read or the training code runs."""

from __future__ import annotations

import json
import sys
import time

import pytest

from procap.commands.cli import build_parser, main
from procap.core.config import get_preset
from procap.core.extras import is_installed
from procap.train import batch_memory

FIRST_SECOND = 1.0


@pytest.fixture
def no_training(monkeypatch):
    """Every training and demo entry point fails the test if it is reached."""
    from procap.experiments import demo as demo_pipeline
    from procap.train import stage1, stage2, vqgan_train

    def reached(*args, **kwargs):
        raise AssertionError("the work started before the check")

    for module, name in ((stage2, "train"), (stage1, "pretrain"), (vqgan_train, "train_vqgan")):
        monkeypatch.setattr(module, name, reached)
    monkeypatch.setattr(demo_pipeline, "run_demo", reached)


@pytest.fixture
def data_dir(tmp_path):
    """A dataset folder (its content is never read: the checks come first), apart from the run folders."""
    folder = tmp_path / "data"
    folder.mkdir()
    return folder


def _missing(monkeypatch, *modules: str) -> None:
    """Make ``modules`` unimportable, as on an install without their extra (``import`` raises, find_spec is None)."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def _fails_at_once(argv: list[str], capsys) -> str:
    build_parser()  # the commands' modules imported first: only the command's own run is timed
    import torch  # noqa: F401  (the parser no longer brings it, tests/commands/test_cli_startup.py; it is no check's cost)

    start = time.perf_counter()
    code = main(argv)
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("procap: error:") and err.count("\n") == 1, err
    assert elapsed < FIRST_SECOND, f"the check took {elapsed:.2f} s"
    return err


def test_the_module_machinery_stand_in_reads_as_missing(monkeypatch):
    assert is_installed("json")
    _missing(monkeypatch, "pycocoevalcap")
    assert not is_installed("pycocoevalcap") and not is_installed("pycocoevalcap.bleu.bleu")


def test_train_without_the_eval_extra_fails_before_training(tmp_path, data_dir, monkeypatch, capsys, no_training):
    _missing(monkeypatch, "pycocoevalcap")
    argv = ["train", "--data", str(data_dir), "--out", str(tmp_path / "run"), "--preset", "tiny", "--device", "cpu"]
    err = _fails_at_once(argv, capsys)
    assert "pycocoevalcap" in err and "[eval]" in err and "validation" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("stage", ["vqgan", "pretrain", "train"])
def test_a_missing_logger_fails_before_training(tmp_path, data_dir, monkeypatch, capsys, no_training, stage):
    _missing(monkeypatch, "wandb")
    argv = [stage, "--data", str(data_dir), "--out", str(tmp_path / "run"), "--preset", "tiny", "--device", "cpu"]
    err = _fails_at_once([*argv, "--logger", "wandb"], capsys)
    assert "wandb (--logger wandb)" in err and "[wandb]" in err


def test_pretrain_on_a_procedure_cache_without_h5py_fails_before_training(
    tmp_path, data_dir, monkeypatch, capsys, no_training
):
    _missing(monkeypatch, "h5py")
    cache = tmp_path / "procedures"  # an existing folder: that it is a readable cache is checked later
    cache.mkdir()
    argv = ["pretrain", "--data", str(data_dir), "--out", str(tmp_path / "run"), "--preset", "tiny"]
    err = _fails_at_once([*argv, "--procedures", str(cache), "--device", "cpu"], capsys)
    assert "h5py (the procedure cache" in err and "[train]" in err


def test_demo_names_every_missing_package_before_it_starts(tmp_path, monkeypatch, capsys, no_training):
    _missing(monkeypatch, "pycocoevalcap", "cv2")
    err = _fails_at_once(["demo", "--out", str(tmp_path / "demo")], capsys)
    assert "pycocoevalcap (the caption metrics) and cv2 (the optical-flow procedures)" in err
    assert "[eval] and [train] extras" in err and "procap-torch[eval,train]" in err
    assert not (tmp_path / "demo").exists()

    # the cross-fade stand-in needs no optical flow
    crossfade = _fails_at_once(["demo", "--out", str(tmp_path / "demo"), "--procedures", "crossfade"], capsys)
    assert "cv2" not in crossfade and "pycocoevalcap" in crossfade


def test_the_vqgan_bound_counts_what_training_keeps():
    """The paper's VQGAN at 224 px keeps about 1.8 GiB an image for its backward pass: its default batch of 16 in
    float32 cannot fit on a 23.5 GiB machine (the run the bound of one feature map let through, killed at 23 GB)."""
    clevr = get_preset("clevr")
    assert batch_memory.batch_bytes(clevr, 16, "vqgan", activation_bytes=4) > 24 * 2**30
    assert batch_memory.batch_bytes(clevr, 4, "vqgan", activation_bytes=4) < 16 * 2**30
    bf16 = batch_memory.batch_bytes(clevr, 16, "vqgan", activation_bytes=2)
    assert bf16 < batch_memory.batch_bytes(clevr, 16, "vqgan", activation_bytes=4)
    tiny = get_preset("tiny")
    assert batch_memory.batch_bytes(tiny, 16, "vqgan", activation_bytes=4) < 2**30


def test_vqgan_without_preset_is_refused_before_allocating(tmp_path, monkeypatch, capsys, no_training):
    from procap.data.synthetic import generate

    data = tmp_path / "data"
    generate(data, 20, size=16, seed=3, progress=False)
    monkeypatch.setattr(batch_memory, "device_memory", lambda device=None: (int(23.5 * 2**30), "the 23.5 GiB test"))
    batch_memory.vqgan_training_footprint(get_preset("clevr").vqgan)  # counted once per process; timed below
    err = _fails_at_once(["vqgan", "--data", str(data), "--out", str(tmp_path / "run"), "--device", "cpu"], capsys)
    assert "--batch-size 16 needs at least" in err and "224 px images (clevr model)" in err
    assert not (tmp_path / "run").exists()


def test_train_asking_for_meteor_without_java_fails_before_training(
    tmp_path, data_dir, monkeypatch, capsys, no_training
):
    from procap.eval import metrics

    monkeypatch.setattr(metrics, "java_available", lambda: False)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"val_metrics": ["METEOR", "CIDEr"], "preset": "tiny", "device": "cpu"}))
    argv = ["train", "--config", str(config), "--data", str(data_dir), "--out", str(tmp_path / "run")]
    err = _fails_at_once(argv, capsys)
    assert "METEOR needs a Java runtime" in err and "val_metrics" in err
