"""A run folder belongs to one run (procap/train/run_folder.py), through the library as through the CLI.

A finished or foreign run is refused without ``--resume`` or ``--overwrite``; ``--overwrite`` trains beside the
old run and swaps at the end, so a replacement that stops leaves the old run as it was; ``synth --overwrite``
likewise writes the new benchmark before the old one goes.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from procap.errors import ProCapError
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from procap.train.run_guard import TrainingInterrupted
from tests.support import small_training_config


@pytest.fixture
def small_model(monkeypatch):
    from procap.train import stage1

    monkeypatch.setattr(
        stage1, "new_model", lambda preset, vocab, vqgan, **kw: ProCap(small_training_config(len(vocab), **kw))
    )


def _config(out, **kw) -> TrainConfig:
    base = {"stage": "pretrain", "out": str(out), "steps": 2, "batch_size": 4, "log_every": 1, "progress": False}
    return TrainConfig(**{**base, **kw})


def _contents(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def stage1_run(tmp_path, small_model, train_pairs, vocab):
    from procap.train.stage1 import pretrain

    out = tmp_path / "s1"
    pretrain(_config(out, seed=1), pairs=train_pairs, vocab=vocab)
    return out


def test_a_finished_run_is_marked_and_refused_without_resume_or_overwrite(stage1_run, train_pairs, vocab):
    from procap.train.stage1 import pretrain

    assert json.loads((stage1_run / "run.json").read_text()) == {"kind": "pretrain", "state": "finished"}
    before = _contents(stage1_run)
    with pytest.raises(ProCapError, match="holds a finished `procap pretrain` run; pass --resume"):
        pretrain(_config(stage1_run, seed=2), pairs=train_pairs, vocab=vocab)
    assert _contents(stage1_run) == before


def test_stage_two_may_not_write_into_the_stage_one_folder(stage1_run, train_pairs, vocab, clevr_root):
    from procap.train.stage2 import train

    before = _contents(stage1_run)
    init = str(stage1_run / "stage1.safetensors")
    config = TrainConfig(stage="train", out=str(stage1_run), init=init, steps=1, batch_size=2, progress=False)
    with pytest.raises(ProCapError, match="a `procap train` run may not write into"):
        train(config, pairs=train_pairs, val_pairs=train_pairs[:2], truths={})
    with pytest.raises(ProCapError, match="not a `procap train` run to continue"):
        train(TrainConfig(**{**config.to_dict(), "resume": True}), pairs=train_pairs, val_pairs=train_pairs[:2])
    assert _contents(stage1_run) == before


def test_overwrite_replaces_the_run_whole_when_the_new_one_finishes(stage1_run, train_pairs, vocab):
    from procap.train.stage1 import pretrain

    old_log = (stage1_run / "log.jsonl").read_bytes()
    (stage1_run / "notes.txt").write_text("kept only by the old run")
    pretrain(_config(stage1_run, seed=2, overwrite=True), pairs=train_pairs, vocab=vocab)
    assert (stage1_run / "log.jsonl").read_bytes() != old_log
    assert not (stage1_run / "notes.txt").exists()  # the folder was replaced, not merged into
    assert json.loads((stage1_run / "run.json").read_text())["state"] == "finished"
    assert json.loads((stage1_run / "stage1_config.json").read_text())["seed"] == 2
    assert sorted(p.name for p in stage1_run.parent.iterdir()) == ["s1"]  # nothing left beside it


def test_an_interrupted_overwrite_leaves_the_old_run(stage1_run, train_pairs, vocab, monkeypatch):
    from procap.train.stage1 import pretrain

    before = _contents(stage1_run)
    original = ProCap.stage1_loss

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the step finishes, then the run stops
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProCap, "stage1_loss", signalled)
    with pytest.raises(TrainingInterrupted, match=f"the run in {stage1_run} was left as it was"):
        pretrain(_config(stage1_run, seed=2, overwrite=True), pairs=train_pairs, vocab=vocab)
    assert _contents(stage1_run) == before
    assert sorted(p.name for p in stage1_run.parent.iterdir()) == ["s1"]


def test_a_replacement_refused_at_its_start_leaves_nothing_beside_the_run(stage1_run, train_pairs, vocab):
    from procap.train.run_guard import RunFolderLock
    from procap.train.stage1 import pretrain

    before = _contents(stage1_run)
    with RunFolderLock(stage1_run), pytest.raises(ProCapError, match="in use by another procap run"):
        pretrain(_config(stage1_run, seed=2, overwrite=True), pairs=train_pairs, vocab=vocab)
    assert _contents(stage1_run) == before
    assert sorted(p.name for p in stage1_run.parent.iterdir()) == ["s1"]


def test_a_run_from_a_config_file_reads_paths_relative_to_the_file(tmp_path, clevr_root, monkeypatch):
    from procap.commands.cli_args import add_common_arguments, config_from_args

    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "data").symlink_to(clevr_root)
    options = {"data": "data", "out": "runs/a", "preset": "tiny", "steps": 1, "init_encoder": "clip:vit.pt"}
    (folder / "c.json").write_text(json.dumps(options))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a replay from another folder reads the same dataset

    import argparse

    parser = argparse.ArgumentParser()
    add_common_arguments(parser, "pretrain")
    with pytest.raises(ProCapError, match="vit.pt"):  # the CLIP file is looked for beside the config too
        config_from_args("pretrain", parser.parse_args(["--config", str(folder / "c.json")]))
    options.pop("init_encoder")
    (folder / "c.json").write_text(json.dumps(options))
    config = config_from_args("pretrain", parser.parse_args(["--config", str(folder / "c.json")]))
    assert (config.data, config.out) == (str(folder / "data"), str(folder / "runs" / "a"))
    # a flag on the command line is relative to the working folder, as every flag is
    config = config_from_args("pretrain", parser.parse_args(["--config", str(folder / "c.json"), "--out", "b"]))
    assert config.out == "b"


def test_an_interrupted_synth_overwrite_keeps_the_old_benchmark(tmp_path, monkeypatch):
    from procap.data import synthetic

    root = tmp_path / "bench"
    synthetic.generate(root, 6, size=16, seed=1, progress=False)
    before = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    original = synthetic._save_png
    saved = {"n": 0}

    def interrupted(array, path):
        saved["n"] += 1
        if saved["n"] == 5:  # Ctrl-C while the new benchmark's images are being written
            raise KeyboardInterrupt
        original(array, path)

    monkeypatch.setattr(synthetic, "_save_png", interrupted)
    with pytest.raises(KeyboardInterrupt):
        synthetic.generate(root, 8, size=16, seed=2, progress=False)
    after = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == before  # the old benchmark whole, and nothing of the new one

    monkeypatch.setattr(synthetic, "_save_png", original)
    synthetic.generate(root, 8, size=16, seed=2, progress=False)
    assert json.loads((root / "scenes.json").read_text())["seed"] == 2
    assert len(list((root / "images").iterdir())) == 8
    assert sorted(p.name for p in root.iterdir()) == sorted(synthetic.LAYOUT)


def test_an_init_inside_the_run_folder_from_a_config_file_is_refused(tmp_path, clevr_root):
    """The run's own files are checked against the inputs a --config file names, not only the flags' inputs."""
    import argparse

    from procap.commands.cli_args import add_common_arguments, config_from_args

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.safetensors").write_bytes(b"a checkpoint of an earlier run")
    options = {"data": str(clevr_root), "out": "run", "init": "run/best.safetensors", "steps": 1}
    (tmp_path / "c.json").write_text(json.dumps(options))
    parser = argparse.ArgumentParser()
    add_common_arguments(parser, "train")
    with pytest.raises(ProCapError, match=r"best.safetensors is --init .*, which this command reads"):
        config_from_args("train", parser.parse_args(["--config", str(tmp_path / "c.json")]))
