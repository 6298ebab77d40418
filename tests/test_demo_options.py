"""`procap demo` passes the benchmark's viewpoint and the stage-1 procedure source through to its runs."""

from __future__ import annotations

import json

import pytest

from procap.checkpoint import read_checkpoint_metadata
from procap.commands.demo_pipeline import run_demo
from procap.errors import ProCapError
from tests.support import micro_demo_budget


@pytest.mark.slow
def test_demo_with_a_viewpoint_and_truth_procedures(tmp_path):
    summary = run_demo(
        tmp_path, budget=micro_demo_budget(), procedures="truth", viewpoint="distractor", progress=False, jobs=1
    )
    assert summary["viewpoint"] == "distractor" and summary["procedures"] == "truth"
    assert summary["keyframes"] == {}  # no cache, so no confidence scores to describe
    scenes = json.loads((tmp_path / "data" / "scenes.json").read_text())
    assert scenes["viewpoint"] == "distractor" and all("after_view" in s for s in scenes["scenes"])
    assert not (tmp_path / "procedures").exists()
    stage1 = read_checkpoint_metadata(tmp_path / "stage1" / "stage1.safetensors")
    assert stage1["extra"]["procedures"] == "truth"
    assert json.loads((tmp_path / "metrics.json").read_text())["viewpoint"] == "distractor"


def test_demo_refuses_an_unknown_viewpoint_or_source_before_writing(tmp_path):
    with pytest.raises(ProCapError, match="viewpoint must be one of"):
        run_demo(tmp_path, budget=micro_demo_budget(), viewpoint="sideways")
    with pytest.raises(ValueError, match="procedures must be one of interpolated, crossfade, truth"):
        run_demo(tmp_path, budget=micro_demo_budget(), procedures="flow")
    assert not any(tmp_path.iterdir())
