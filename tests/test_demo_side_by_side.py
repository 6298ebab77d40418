"""`procap demo` trains a seed's models side by side in worker processes: the same models as training them in turn."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from procap.experiments.demo import MODELS, default_jobs, run_demo
from tests.support import micro_demo_budget

MICRO = micro_demo_budget()


def test_default_jobs_trains_side_by_side_only_on_a_multithreaded_cpu():
    assert len(MODELS) == 4  # the 2 x 2 ablation
    assert default_jobs("cpu", threads=2) == 2  # one run per thread: two rounds of two
    assert default_jobs("cpu", threads=3) == 3
    assert default_jobs("cpu", threads=16) == len(MODELS)
    assert default_jobs("cpu", threads=1) == 1
    assert default_jobs("cuda", threads=16) == 1


@pytest.mark.slow
def test_side_by_side_training_gives_the_models_of_training_in_turn(tmp_path):
    # Tests run torch on one thread, so each worker gets one thread too: the same arithmetic, bit for bit.
    assert torch.get_num_threads() == 1
    kwargs = {"budget": MICRO, "procedures": "crossfade", "progress": False}
    in_turn = run_demo(tmp_path / "in_turn", jobs=1, **kwargs)
    side = run_demo(tmp_path / "side", jobs=len(MODELS), **kwargs)
    assert (in_turn["jobs"], side["jobs"]) == (1, len(MODELS))
    assert "side_by_side" in side["phases_s"] and "side_by_side" not in in_turn["phases_s"]
    for phase in ("stage1", *(name for name, _ in MODELS)):  # workers report their own phase times
        assert side["phases_s"][phase] > 0, phase

    initial = load_file(tmp_path / "side" / "stage1" / "stage1.safetensors")
    initial_in_turn = load_file(tmp_path / "in_turn" / "stage1" / "stage1.safetensors")
    assert initial.keys() == initial_in_turn.keys()
    assert all(torch.equal(initial[k], initial_in_turn[k]) for k in initial)  # stage 1 before the workers
    for name, label in MODELS:
        a = load_file(tmp_path / "in_turn" / name / "best.safetensors")
        b = load_file(tmp_path / "side" / name / "best.safetensors")
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=f"{name}: {key}")
        assert in_turn["results"][label]["accuracy"] == side["results"][label]["accuracy"]
    # ProCap's stage 2 trained on from stage 1 (the in-turn run starts from it too): its weights are not stage 1's
    procap = load_file(tmp_path / "side" / "procap" / "best.safetensors")
    shared = [k for k in initial if k in procap and initial[k].shape == procap[k].shape]
    assert shared and any(not torch.equal(initial[k], procap[k]) for k in shared)
    # the stage-1 static pair starts from the same stage 1, its queries dropped: k = 0, before / after positions
    assert side["results"]["stage 1, static pair (k=0)"]["num_keyframes"] == 0
    assert load_file(tmp_path / "side" / "stage1_static" / "best.safetensors")["pos_frame"].shape[0] == 2


def test_run_demo_refuses_a_job_count_it_cannot_use(tmp_path):
    with pytest.raises(ValueError, match="jobs must be between 1 and 4"):
        run_demo(tmp_path, budget=MICRO, jobs=5)
    assert not any(tmp_path.iterdir())  # refused before anything was written
