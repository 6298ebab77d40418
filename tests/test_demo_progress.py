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


@pytest.mark.parametrize(
    "seconds,shown",
    [(0, "0s"), (44.6, "45s"), (60, "1m"), (719, "12m"), (3569, "59m"), (3570, "1h00m"), (3900, "1h05m")],
)
def test_durations_read_as_a_person_reads_them(seconds, shown):
    assert demo_pipeline.format_duration(seconds) == shown


def test_the_status_line_gives_the_time_left_of_each_run_the_phase_and_the_demo(tmp_path):
    """Two runs measured (1 and 0.5 steps/s of wall clock), two waiting on 2 processes: 200 s and 500 s left, the
    waiting ones at the mean 0.75 steps/s (400 s each) start at 200 s and 500 s, so the phase ends at 900 s. One
    later seed as long as this one (600 s so far + 900 s + a 60 s evaluation) makes the demo 900 + 60 + 1560 s."""
    clock = Clock(verbose=False)
    monitor = SideBySideMonitor(
        _configs(tmp_path), clock, queue.Queue(), progress=True, jobs=2, later_seeds=1,
        seed_started=clock.total - 600, evaluate_s=60.0,
    )  # fmt: skip
    _log(tmp_path / "procap", {"step": 100, "items_per_s": 8.0})
    _log(tmp_path / "procap_no_stage1", {"step": 50, "items_per_s": 8.0})
    now = time.time()
    monitor.first_seen = {"procap": now - 100, "procap_no_stage1": now - 100}
    line = monitor.status()
    assert "procap 100/300 2.0 steps/s 3m left" in line  # 200 s
    assert "procap_no_stage1 50/300 2.0 steps/s 8m left" in line  # 500 s
    assert line.endswith("| phase 15m left, demo 42m left"), line


def test_no_time_left_is_guessed_before_a_run_has_a_rate(tmp_path):
    monitor = SideBySideMonitor(_configs(tmp_path), Clock(verbose=False), queue.Queue(), progress=True, jobs=2)
    assert "left" not in monitor.status()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie waiting for its new parent to reap it has)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads process states from /proc (Linux)")
def test_a_worker_ends_when_the_demo_that_started_it_is_killed(tmp_path):
    """``kill -9`` of the demo cannot stop its pool: each worker sees its parent gone and stops (SIGTERM)."""
    import contextlib
    import signal
    import subprocess
    import sys

    ready = tmp_path / "ready"
    child = (
        "from procap.experiments.demo import follow_parent; import pathlib, time; follow_parent(0.1); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(120)"
    )
    parent = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    demo = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    worker = int(demo.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:  # the worker watches its parent from here on
            time.sleep(0.1)
        assert ready.exists() and _running(worker)
        demo.send_signal(signal.SIGKILL)
        demo.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker), "the worker outlived its killed parent"
    finally:
        for pid in (worker, demo.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_log_stamped_by_a_coarse_clock_just_before_the_monitor_started_is_live(tmp_path):
    """File mtimes come from a coarser clock than time.time(): a log written right after the monitor started can
    carry a stamp a few milliseconds before it (a CI run showed such a run as waiting)."""
    from procap.experiments.demo import MTIME_SLACK_S, _live_log

    log = tmp_path / "procap" / "log.jsonl"
    log.parent.mkdir()
    log.write_text("{}\n")
    since = time.time()
    os.utime(log, (since - 0.01, since - 0.01))
    assert _live_log(log.parent, since) == log
    os.utime(log, (since - 10 * MTIME_SLACK_S, since - 10 * MTIME_SLACK_S))  # an earlier run's log
    assert _live_log(log.parent, since) is None
