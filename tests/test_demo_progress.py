"""What `procap demo` prints while its stage-2 runs train side by side in worker processes (issue 41, item 6): one
status line with each run's steps and rate, the workers' lines stamped with the demo's clock, and a summary that
says how the runs shared the machine."""

from __future__ import annotations

import json
import os
import queue
import re
import time

import pytest

from procap.core.logs import console_logging
from procap.experiments import demo as demo_pipeline
from procap.experiments.demo import (
    MODELS,
    Clock,
    SideBySideMonitor,
    _LinesToParent,
    _live_log,
    describe_parallelism,
)
from procap.train.config import TrainConfig


@pytest.fixture(autouse=True)
def _console():
    """The demo logs its lines; the command line shows them through its console handler, as here."""
    with console_logging():
        yield


def _configs(tmp_path) -> dict[str, TrainConfig]:
    return {name: TrainConfig(stage="train", out=str(tmp_path / name), steps=300, batch_size=4) for name, _ in MODELS}


def _log(folder, *records) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "log.jsonl").open("a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def test_the_status_line_gives_each_runs_steps_and_rate(tmp_path):
    configs = _configs(tmp_path)
    monitor = SideBySideMonitor(configs, Clock(verbose=False), queue.Queue(), progress=True)
    _log(tmp_path / "procap", {"step": 10, "items_per_s": 8.0, "loss": 1.0}, {"step": 10, "val/CIDEr": 5.0})
    _log(tmp_path / "procap_no_stage1")  # created, no step logged yet
    monitor.finished("static")
    line = monitor.status()
    assert line.startswith("stage 2: ")
    assert "procap 10/300 2.0 steps/s" in line  # 8 items/s at batch 4; the validation record after it is skipped
    assert "procap_no_stage1 starting" in line and "stage1_static waiting" in line and "static done" in line


def test_a_log_older_than_the_phase_is_an_earlier_runs_and_a_replacing_run_is_found_beside(tmp_path):
    out = tmp_path / "procap"
    _log(out, {"step": 600, "items_per_s": 4.0})
    old = time.time() - 3600
    os.utime(out / "log.jsonl", (old, old))
    since = time.time() - 60
    assert _live_log(out, since) is None  # the run being replaced: its log is not this run's progress
    beside = tmp_path / ".procap.replacing-abc"
    _log(beside, {"step": 3, "items_per_s": 4.0})
    assert _live_log(out, since) == beside / "log.jsonl"


def test_worker_lines_are_printed_by_the_parent_with_the_demos_clock(tmp_path, capsys):
    lines: queue.Queue = queue.Queue()
    writer = _LinesToParent(lines, "out")
    writer.write("stage2 step 600 validation (procap): BLEU-4 50.00")
    writer.write(", CIDEr 120.00\nhalf a line")
    assert lines.qsize() == 1  # whole lines only
    _LinesToParent(lines, "err").write("UserWarning: the captions stopped varying\n")
    with SideBySideMonitor(_configs(tmp_path), Clock(verbose=False), lines, progress=False):
        pass
    out, err = capsys.readouterr()
    assert re.fullmatch(r"\[ *\d+\.\ds\] stage2 step 600 validation \(procap\): BLEU-4 50.00, CIDEr 120.00\n", out)
    assert re.fullmatch(r"\[ *\d+\.\ds\] UserWarning: the captions stopped varying\n", err)


def test_without_a_terminal_the_status_is_a_line_every_while_and_none_without_progress(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(SideBySideMonitor, "EVERY_S", 0.0)
    for progress, expected in ((True, True), (False, False)):
        monitor = SideBySideMonitor(_configs(tmp_path), Clock(verbose=False), queue.Queue(), progress=progress)
        _log(tmp_path / "procap", {"step": 7, "items_per_s": 4.0})  # written after the phase began
        with monitor:
            time.sleep(1.5)
        out = capsys.readouterr().out
        assert ("stage 2: procap 7/300 1.0 steps/s" in out) is expected, out
        assert "\r" not in out  # not a terminal: no redrawn line


@pytest.mark.parametrize(
    "threads,jobs,expected",
    [
        (2, 1, "on 2 threads"),
        (1, 1, "on 1 thread"),
        (3, 3, "stage 2 as 3 processes x 1 thread side by side (the rest on 3 threads)"),
        (16, 4, "stage 2 as 4 processes x 4 threads side by side (the rest on 16 threads)"),
    ],
)
def test_the_summary_says_how_the_runs_shared_the_machine(threads, jobs, expected):
    assert describe_parallelism({"threads": threads, "jobs": jobs}) == expected


def test_the_summary_line_uses_it(monkeypatch):
    monkeypatch.setattr(demo_pipeline, "format_table", lambda results, metrics: "table")
    monkeypatch.setattr(demo_pipeline, "format_failures", lambda results: "failures")
    summary = {"threads": 3, "jobs": 3, "total_s": 12.0, "phases_s": {"stage1": 2.0}}
    last = demo_pipeline.summary_text({}, [], [], summary, None).strip().splitlines()[-1]
    assert (
        last == "total 12 s, stage 2 as 3 processes x 1 thread side by side (the rest on 3 threads); phases: stage1 2s"
    )
