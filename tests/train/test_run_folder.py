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

from procap.core.errors import ProCapError
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from procap.train.run_guard import TrainingInterrupted


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
        signal.raise_signal(signal.SIGTERM)  # the step finishes, then the run stops
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProCap, "stage1_loss", signalled)
    with pytest.raises(TrainingInterrupted, match=f"the run in {stage1_run} was left as it was"):
        pretrain(_config(stage1_run, seed=2, overwrite=True), pairs=train_pairs, vocab=vocab)
    assert _contents(stage1_run) == before
    assert sorted(p.name for p in stage1_run.parent.iterdir()) == ["s1"]


def test_a_replacement_refused_at_its_start_leaves_nothing_beside_the_run(stage1_run, train_pairs, vocab):
    from procap.core.files import RunFolderLock
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


# -- replacing is atomic: the old or the new is whole at every moment (issue 39 A) ---------------------------------
def _tree(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _interrupt_rename(monkeypatch, module, number: int, error: type[BaseException] = KeyboardInterrupt) -> None:
    """``module``'s ``os.rename`` raises ``error`` at its ``number``-th call (1-based), as a Ctrl-C or a failing
    disk would there."""
    real = os.rename
    calls = {"n": 0}

    def rename(src, dst):
        calls["n"] += 1
        if calls["n"] == number:
            raise error("interrupted")
        return real(src, dst)

    monkeypatch.setattr(module.os, "rename", rename)


@pytest.mark.parametrize(
    ("number", "error"),
    [(1, KeyboardInterrupt), (2, KeyboardInterrupt), (2, OSError)],
    ids=["before the first rename", "between the renames", "second rename fails"],
)
def test_an_interrupted_folder_swap_leaves_the_old_folder(tmp_path, monkeypatch, number, error):
    from procap.core import files

    old, new = tmp_path / "run", tmp_path / ".run.replacing-1"
    for folder, text in ((old, "old"), (new, "new")):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "f.txt").write_text(text)
    _interrupt_rename(monkeypatch, files, number, error)
    with pytest.raises(error):
        files.swap_folder(new, old)
    assert _tree(old) == {"sub/f.txt": b"old"} and _tree(new) == {"sub/f.txt": b"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.replacing-1", "run"]
    monkeypatch.undo()
    files.swap_folder(new, old)
    assert _tree(old) == {"sub/f.txt": b"new"} and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_ctrl_c_during_the_swap_is_delivered_after_it(tmp_path):
    from procap.core import files

    old, new = tmp_path / "run", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (new / "f").write_text("new")
    real = os.rename
    delivered = []

    def on_ctrl_c(signum, frame):  # this test's own handler: what it finds on delivery, then a Ctrl-C's error
        delivered.append((old / "f").is_file())
        raise KeyboardInterrupt

    def signalled(src, dst):
        # A Ctrl-C arriving between the renames runs whatever handler is installed at that moment. Calling it here
        # makes the arrival exact: a signal sent to the process was, twice in loaded CI runs, not seen at all.
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        real(src, dst)

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    os.rename = signalled
    try:
        with pytest.raises(KeyboardInterrupt):
            files.swap_folder(new, old)
    finally:
        os.rename = real
        signal.signal(signal.SIGINT, previous)
    assert delivered == [True]  # delivered once, after both renames (the new folder in place)
    assert (old / "f").read_text() == "new"


def test_an_overwrite_interrupted_in_its_swap_keeps_the_old_run(stage1_run, train_pairs, vocab, monkeypatch):
    from procap.core import files
    from procap.train.stage1 import pretrain

    before = _tree(stage1_run)
    _interrupt_rename(monkeypatch, files, 2)  # the swap's second rename: the new run onto the old one's name
    with pytest.raises(KeyboardInterrupt):
        pretrain(_config(stage1_run, seed=2, overwrite=True), pairs=train_pairs, vocab=vocab)
    assert _tree(stage1_run) == before
    assert sorted(p.name for p in stage1_run.parent.iterdir()) == ["s1"]  # the new run discarded, no backup left


def test_a_run_killed_between_the_renames_is_put_back_by_the_next_run(stage1_run, train_pairs, vocab, caplog):
    from procap.core.files import beside
    from procap.train.run_folder import check_run_folder
    from procap.train.stage1 import pretrain

    before = _tree(stage1_run)
    backup, stale = beside(stage1_run, "replaced"), beside(stage1_run, "replacing-x1")
    os.rename(stage1_run, backup)  # what `kill -9` between the two renames leaves
    stale.mkdir()  # and the new run it was swapping in
    with pytest.raises(ProCapError, match="holds a finished `procap pretrain` run"):
        check_run_folder(_config(stage1_run, seed=2))  # any run into the folder puts it back, even one refused
    assert "put back" in caplog.text  # a logged warning (the command line shows it on stderr)
    assert _tree(stage1_run) == before and not backup.exists()
    pretrain(_config(stage1_run, seed=2, overwrite=True), pairs=train_pairs, vocab=vocab)
    assert sorted(p.name for p in stage1_run.parent.iterdir()) == ["s1"]  # the killed replacement's folder went too


def test_the_old_copy_a_finished_swap_left_is_deleted(tmp_path):
    from procap.core.files import beside, recover_swap

    final = tmp_path / "run"
    final.mkdir()
    beside(final, "replaced").mkdir()
    assert "removed" in recover_swap(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and recover_swap(final) is None


def test_names_beside_a_long_folder_name_fit_and_differ(tmp_path):
    from procap.core.files import beside, name_limit

    long_a, long_b = tmp_path / ("a" * 250), tmp_path / ("a" * 249 + "b")
    for path in (beside(long_a, "replaced"), beside(long_a, "replacing-")):
        assert len(os.fsencode(path.name)) + 16 <= name_limit(tmp_path)
    assert beside(long_a, "replaced") != beside(long_b, "replaced")


@pytest.mark.parametrize("number", [1, 3, 8], ids=["first entry", "third entry", "last entry"])
def test_synth_interrupted_in_its_swap_keeps_the_old_benchmark(tmp_path, monkeypatch, number):
    from procap.data import synthetic

    root = tmp_path / "bench"
    synthetic.generate(root, 4, size=16, seed=1, progress=False)
    before = _tree(root)
    real_swap = synthetic._swap_in

    def swap_interrupted(staging, target):
        _interrupt_rename(monkeypatch, synthetic, 2 * number)  # moving the number-th new entry into place
        real_swap(staging, target)

    monkeypatch.setattr(synthetic, "_swap_in", swap_interrupted)
    with pytest.raises(KeyboardInterrupt):
        synthetic.generate(root, 6, size=16, seed=2, progress=False)
    assert _tree(root) == before  # the old benchmark whole, nothing of the new one, no staging folder


def test_synth_killed_in_its_swap_is_put_back_by_the_next_synth(tmp_path, monkeypatch):
    from procap.data import synthetic

    root = tmp_path / "bench"
    synthetic.generate(root, 4, size=16, seed=1, progress=False)
    before = _tree(root)
    real_swap = synthetic._swap_in

    def killed(staging, target):  # stops after three entries and cannot undo them, as `kill -9` would
        _interrupt_rename(monkeypatch, synthetic, 7)
        monkeypatch.setattr(synthetic, "_move_back", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
        real_swap(staging, target)

    monkeypatch.setattr(synthetic, "_swap_in", killed)
    with pytest.raises(KeyboardInterrupt):
        synthetic.generate(root, 6, size=16, seed=2, progress=False)
    assert _tree(root) != before and list(root.glob(".synth-new-*"))  # mixed, with the old entries kept aside
    monkeypatch.undo()
    synthetic.recover_interrupted_swap(root)
    assert _tree(root) == before and not list(root.glob(".synth-new-*"))
