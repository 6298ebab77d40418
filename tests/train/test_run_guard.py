"""One writer per run folder; Ctrl-C / SIGTERM save a resumable checkpoint; a default time-based save.

A second `procap train` on the --out of a running one is refused; an interrupted run with the default --save-every
keeps its steps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from procap.core.errors import ProCapError
from procap.core.files import RunFolderLock
from procap.loading.checkpoint import read_checkpoint_metadata
from procap.model.procap import ProCap
from procap.train.config import TrainConfig
from procap.train.loop import JsonlLog
from procap.train.run_guard import StopRequests, TrainingInterrupted


def _config(out, **kw) -> TrainConfig:
    base = {
        "stage": "pretrain",
        "out": str(out),
        "steps": 6,
        "batch_size": 4,
        "lr": 1e-3,
        "warmup_steps": 2,
        "log_every": 1,
        "progress": False,
        "seed": 5,
    }
    return TrainConfig(**{**base, **kw})


def _losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in JsonlLog(out / "log.jsonl").records() if "loss" in r}


def test_a_locked_folder_refuses_a_second_writer(tmp_path):
    with RunFolderLock(tmp_path), pytest.raises(ProCapError, match="in use by another procap run"):
        RunFolderLock(tmp_path).__enter__()
    with RunFolderLock(tmp_path):  # released on exit
        pass


def test_a_second_process_is_refused_while_the_first_trains(tmp_path, small_model, train_pairs, vocab):
    """The lock holds across processes: a child process holds it, the in-process run stops with one sentence."""
    out = tmp_path / "run"
    out.mkdir()
    hold = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        from procap.train.stage1 import pretrain

        with pytest.raises(ProCapError, match="in use by another procap run"):
            pretrain(_config(out), pairs=train_pairs, vocab=vocab)
        assert list(out.iterdir()) == []  # no config, log or checkpoint of the refused run
    finally:
        holder.kill()
        holder.wait()


def test_sigterm_saves_the_step_and_resume_matches(tmp_path, small_model, train_pairs, vocab, monkeypatch):
    from procap.train.stage1 import pretrain

    pretrain(_config(tmp_path / "full"), pairs=train_pairs, vocab=vocab)
    reference = _losses(tmp_path / "full")

    calls = {"n": 0}
    original = ProCap.stage1_loss

    def signalled(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # arrives in the middle of step 3: the step finishes, then the run saves and stops
            signal.raise_signal(signal.SIGTERM)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProCap, "stage1_loss", signalled)
    with pytest.raises(TrainingInterrupted, match="saved step 3") as info:
        pretrain(_config(tmp_path / "cut"), pairs=train_pairs, vocab=vocab)
    monkeypatch.setattr(ProCap, "stage1_loss", original)
    assert info.value.signum == signal.SIGTERM
    assert read_checkpoint_metadata(tmp_path / "cut" / "last.safetensors")["extra"]["step"] == 3
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handlers are back

    pretrain(_config(tmp_path / "cut", resume=True), pairs=train_pairs, vocab=vocab)
    resumed = _losses(tmp_path / "cut")
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-6, abs=1e-7), step


def test_ctrl_c_through_the_cli_saves_and_exits_130(tmp_path, small_model, clevr_root, monkeypatch, capsys):
    from procap.commands.cli import main

    original = ProCap.stage1_loss
    calls = {"n": 0}

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            signal.raise_signal(signal.SIGINT)  # what Ctrl-C delivers, to this thread
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProCap, "stage1_loss", interrupted)
    out = tmp_path / "run"
    argv = [
        "pretrain",
        "--data",
        str(clevr_root),
        "--out",
        str(out),
        "--preset",
        "tiny",
        "--vqgan",
        "untrained",  # without it the run first says which tokenizer it takes, a line before the one checked here
        "--steps",
        "50",
        "--batch-size",
        "4",
        "--no-progress",
    ]
    assert main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"procap: interrupted: saved step 2 to {out / 'last.safetensors'}; continue with --resume"


def test_a_second_ctrl_c_stops_at_once():
    with StopRequests() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # sent to this thread: handled before raise_signal returns


def test_the_default_saves_every_five_minutes(tmp_path, small_model, train_pairs, vocab, monkeypatch):
    """Without --save-every, `last` is written when 5 minutes passed since the last save (a clock stands in)."""
    from procap.train import loop
    from procap.train.stage1 import pretrain

    assert TrainConfig().save_minutes == 5.0 and TrainConfig().save_every == 0
    clock = {"now": 1000.0}
    saved_at: list[int] = []
    original_step, original_save = loop.Trainer.train_step, loop.Trainer.save_last

    def step_of_two_minutes(self, batch):
        clock["now"] += 120.0
        return original_step(self, batch)

    def recording_save(self):
        saved_at.append(self.state.step)
        original_save(self)

    monkeypatch.setattr(loop.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(loop.Trainer, "train_step", step_of_two_minutes)
    monkeypatch.setattr(loop.Trainer, "save_last", recording_save)
    pretrain(_config(tmp_path, steps=7), pairs=train_pairs, vocab=vocab)
    assert saved_at == [3, 6, 7]  # 6 minutes after the start, 6 after that, and the final save


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_from_outside_saves_before_exiting(tmp_path, clevr_root):
    """A real `procap pretrain` process, terminated from outside, exits 143 with a resumable checkpoint."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [
        sys.executable,
        "-m",
        "procap",
        "pretrain",
        "--data",
        str(clevr_root),
        "--out",
        str(out),
        "--preset",
        "tiny",
        "--steps",
        "100000",
        "--batch-size",
        "2",
        "--no-progress",
        "--log-every",
        "1",
    ]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # generous: the machine may be busy
        while not (out / "log.jsonl").is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "saved step" in err
    step = read_checkpoint_metadata(out / "last.safetensors")["extra"]["step"]
    assert step >= 1 and max(_losses(out)) == step
