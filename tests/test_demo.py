"""`procap demo --quick` end to end (CI runs it; deselect locally with -m "not slow")."""

from __future__ import annotations

import json
import time

import pytest

from tests.report_checks import check_report_html

# ProCap's bounds on the quick demo's 60 test pairs (30 changes): change detected >= 90 % and change type >= 70 %.
# Measured with one thread a run, as CI runs it (docs/training.md): with the learned front end (issue 54) change
# 98.3 % in three runs, type 80.0 % once and 76.7 % in two fresh-clone CI runs (24 / 23 of 30 changes; the cells
# without stage 1 were identical each time, the two from stage 1 were not); with the front end drawn anew in stage 2
# (restart_front_end) change 95.0 % and type 90.0 % in a fresh-clone CI run. The change bound was 95 %, which that
# run met with no pair to spare; 90 % leaves three pairs below it and is still far above chance (50 %).
QUICK_CHANGE = 0.9
QUICK_TYPE = 0.7
# Share of identical pairs (an image as both before and after) that every model must call "no change": on every test
# image (the demo's own measure) and on every image of ten scenes made afresh with another seed.
IDENTICAL_NO_CHANGE = 0.99


def echo_phases(monkeypatch, capsys) -> None:
    """Show the demo's phase lines on the terminal as they come, while its output is still captured.

    The quick demo takes minutes; under ``pytest -q`` a captured run shows nothing until it ends. Each phase line
    is printed as the demo prints it (into the capture the test reads) and once more with capture suspended.
    """
    from procap.experiments.demo import Clock

    original = Clock.phase

    def phase(clock: Clock, name: str, message: str) -> None:
        original(clock, name, message)
        with capsys.disabled():
            print(f"\n  quick demo [{clock.total:5.0f} s] {message}", flush=True)

    monkeypatch.setattr(Clock, "phase", phase)


def test_phase_lines_reach_the_terminal(monkeypatch, capsys):
    from procap.core.logs import console_logging
    from procap.experiments.demo import Clock

    echo_phases(monkeypatch, capsys)
    shown = []
    monkeypatch.setattr(capsys, "disabled", lambda: _Recording(shown))
    with console_logging():  # the demo logs its phase lines; the command line shows them, as here
        Clock().phase("data", "synthetic benchmark")
    assert "synthetic benchmark" in capsys.readouterr().out  # still captured for the test's checks
    assert len(shown) == 1 and "quick demo [" in shown[0] and "synthetic benchmark" in shown[0]


class _Recording:
    """Stands in for ``capsys.disabled()``: what is printed inside goes to a list instead of the terminal."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def __enter__(self):
        import io
        import sys

        self._stdout, sys.stdout = sys.stdout, io.StringIO()
        return self

    def __exit__(self, *exc):
        import sys

        self.lines.append(sys.stdout.getvalue())
        sys.stdout = self._stdout


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path, capsys, monkeypatch):
    from procap.commands.cli import main

    echo_phases(monkeypatch, capsys)  # minutes of work: the phases show on the terminal even under -q
    start = time.perf_counter()
    # Tests run torch on one thread, which would train the four stage-2 runs in turn; two one-thread workers use both
    # cores of CI's machine for the same arithmetic (tests/test_demo_side_by_side.py), in about half the time.
    assert main(["demo", "--quick", "--out", str(tmp_path), "--no-progress", "--jobs", "2"]) == 0
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out
    assert "ProCap (k=2)" in out and "static pair (k=0)" in out and "CIDEr" in out and "object" in out
    assert "false pos." in out and "move as add/drop" in out  # the failure kinds' table

    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert set(summary["results"]) == {
        "ProCap (k=2)",
        "ProCap, no stage 1 (k=2)",
        "stage 1, static pair (k=0)",
        "static pair (k=0)",
    }
    for report in summary["results"].values():
        assert {"BLEU-4", "ROUGE-L", "CIDEr"} <= set(report["metrics"])
        assert report["speed"]["tokens_per_s"] > 0 and report["pairs"] == summary["pairs"]["test"]
        assert "total" in report["by_type"] and "no_change" in report["by_type"]
    assert summary["results"]["static pair (k=0)"]["num_keyframes"] == 0
    # ProCap minus each other cell, on change / type / object, with an interval around each difference
    assert len(summary["paired"]) == 12 and "95 % interval" in out and "2x2 interaction" in out
    assert all(r["low"] <= r["difference"] <= r["high"] for r in summary["paired"])
    assert summary["results"]["stage 1, static pair (k=0)"]["num_keyframes"] == 0
    assert summary["results"]["ProCap (k=2)"]["num_keyframes"] == 2
    for report in summary["results"].values():
        accuracy = report["accuracy"]
        assert {"change", "type", "object", "distinct"} <= set(accuracy)
        assert {"miss_rate", "false_positive_rate", "unparsed_changes", "move_as_add_drop"} <= set(accuracy)
        assert all(0.0 <= accuracy[k] <= 1.0 for k in ("change", "type", "object", "distinct"))
        assert len(report["seeds"]) == 1 and report["accuracy_std"]["change"] == 0.0
    # The quick budget must not collapse to one caption (a collapsed model detects changes 50 % of the time): it
    # detects changes and writes different captions. Bounds and the figures measured in this test: docs/training.md.
    procap = summary["results"]["ProCap (k=2)"]["accuracy"]
    assert procap["change"] >= QUICK_CHANGE, procap
    assert procap["type"] >= QUICK_TYPE, procap
    assert procap["distinct"] * procap["change_pairs"] > 1, procap
    # the demo's tokenizer is the embedded one, and stage 1's keyframes follow the change instead of float ties
    assert summary["tokenizer"].startswith("embedded")
    keyframes = summary["keyframes"]
    assert keyframes["paper"]["distinct"] == 1 and keyframes["paper"]["earliest"] == 1.0
    assert keyframes["standardize"]["distinct"] > 1 and keyframes["standardize"]["earliest"] < 0.5
    log = [json.loads(line) for line in (tmp_path / "procap" / "log.jsonl").read_text().splitlines()]
    assert any("memory_std" in r for r in log) and any("val/acc_change" in r for r in log)

    for path in (
        "vqgan/vqgan.safetensors",
        "stage1/stage1.safetensors",
        "procap/best.safetensors",
        "static/best.safetensors",
        "stage1_static/best.safetensors",
        "procap/log.jsonl",
        "samples.json",
        "procap/results.json",
    ):
        assert (tmp_path / path).is_file(), path
    samples = json.loads((tmp_path / "samples.json").read_text())
    assert samples and all((tmp_path / s["image"]).is_file() for s in samples)
    # report.html: self-contained (base64 PNGs that decode), every section, one example per change type in samples
    assert f"report: {tmp_path / 'report.html'}" in out
    found = check_report_html(tmp_path / "report.html", {s["change_type"] for s in samples})
    # curves; before, after and imagined strip per example; the explicit procedure of a cached training pair
    assert len(found["images"]) == 1 + 3 * len({s["change_type"] for s in samples}) + 1
    # the same image twice is no change (the quick budget trains with added identical pairs): every test image,
    # then every image of ten new scenes
    for label, report in summary["results"].items():
        identical = report["identical"]
        assert identical["pairs"] > summary["pairs"]["test"], (label, identical)  # befores and afters
        assert identical["rate"] >= IDENTICAL_NO_CHANGE, (label, identical)
        assert report["accuracy"]["identical_change_rate"] == pytest.approx(1 - identical["rate"])
    assert "same image" in out
    fresh = fresh_identical_rate(tmp_path)
    assert fresh["pairs"] >= 20 and fresh["rate"] >= IDENTICAL_NO_CHANGE, fresh
    print(f"quick demo took {elapsed:.0f} s")


def fresh_identical_rate(out, scenes: int = 10) -> dict:
    """The demo's ProCap on every image of ``scenes`` scenes made afresh (``procap synth --seed 7``), each image
    shown as both before and after (:func:`procap.eval.split.identical_pair_rate`)."""
    from procap.data.datasets import load_split
    from procap.data.synthetic import generate
    from procap.eval.split import identical_pair_rate
    from procap.loading.checkpoint import load_checkpoint

    data = out / "fresh"
    generate(data, scenes=scenes, seed=7, progress=False)
    pairs = [pair for split in ("train", "val", "test") for pair in load_split("clevr-change", data, split)]
    model, vocab, _ = load_checkpoint(out / "procap" / "best.safetensors")
    return identical_pair_rate(model, vocab, pairs, progress=False)
