"""tools/pixel_threshold.py: the share of changed pixels and the best single threshold on it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "pixel_threshold.py"
_spec = importlib.util.spec_from_file_location("pixel_threshold", TOOL)
pixel_threshold = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pixel_threshold)


def _run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], check=False, capture_output=True, text=True)


def _png(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)
    return path


def test_changed_share_counts_pixels_over_the_tolerance_in_any_channel(tmp_path):
    before = np.zeros((4, 4, 3))
    after = before.copy()
    after[0, :, 2] = 17  # 4 of 16 pixels over a tolerance of 16, in one channel
    after[1, :2] = 16  # 2 more at the tolerance: not counted
    a, b = _png(tmp_path / "a.png", before), _png(tmp_path / "b.png", after)
    assert pixel_threshold.changed_share(a, b, tolerance=16) == 0.25
    assert pixel_threshold.changed_share(a, b, tolerance=15) == 0.375


def test_best_threshold_accuracy():
    assert pixel_threshold.best_threshold_accuracy([0.5, 0.6], [0.1, 0.2]) == 1.0  # changes above
    assert pixel_threshold.best_threshold_accuracy([0.1, 0.2], [0.5, 0.6]) == 1.0  # changes below
    assert pixel_threshold.best_threshold_accuracy([0.3, 0.3], [0.3, 0.3]) == 0.5  # nothing to tell them apart
    assert pixel_threshold.best_threshold_accuracy([0.1, 0.5, 0.6], [0.2, 0.3, 0.7]) == pytest.approx(4 / 6)


def test_the_tool_on_a_benchmark_folder(tmp_path):
    from procap.data.synthetic import generate

    generate(tmp_path, 20, size=16, seed=0, progress=False)  # the aligned benchmark: 1 distractor in 5 is still
    splits = json.loads((tmp_path / "splits.json").read_text())
    measured = pixel_threshold.measure(tmp_path, ["val", "test"], tolerance=16)
    assert measured["scenes"] == measured["distractors"] == len(splits["val"]) + len(splits["test"])
    assert 0.5 <= measured["best_threshold_accuracy"] <= 1.0
    assert 0.0 < measured["median_change"] < 1.0
    done = _run_tool(str(tmp_path), "--splits", "val", "test")
    accuracy = 100 * measured["best_threshold_accuracy"]
    assert done.returncode == 0 and f"best single threshold {accuracy:.1f} %" in done.stdout
    missing = _run_tool(str(tmp_path / "nothing"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
