"""The ``truth`` stage-1 procedure source: the exact intermediate frames of a ``procap synth`` benchmark."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from procap.core.errors import ProCapError
from procap.data import load_split
from procap.data.images import ImageCache
from procap.data.synthetic import generate, render_intermediate
from procap.model.procap import ProCap
from procap.train.datasets import TruthProcedures, make_procedure_source
from tests.support import small_training_config


@pytest.fixture(scope="module")
def jittered_root(tmp_path_factory):
    """A 10-scene benchmark at 16 px whose change pairs move the view too (``--viewpoint distractor``)."""
    root = tmp_path_factory.mktemp("jittered")
    generate(root, 10, size=16, seed=4, progress=False, viewpoint="distractor")
    return root


@pytest.mark.parametrize("size", [16, 8])  # the benchmark's size, and a resize as a smaller model reads it
def test_truth_frames_at_the_ends_are_the_before_and_after_images(jittered_root, size):
    pairs = load_split("clevr-change", jittered_root, "train")
    assert {p.change_type == "no_change" for p in pairs} == {True, False}  # both kinds of pair
    source, cache = make_procedure_source("truth", 2, str(jittered_root)), ImageCache(size)
    assert isinstance(source, TruthProcedures)
    for pair in pairs:
        before, after = cache(pair.before_path), cache(pair.after_path)
        ends = source.frames_at(pair, [0.0, 1.0], size)
        assert torch.equal(ends[0], before) and torch.equal(ends[1], after), pair.id
        frames = source(pair, before, after)
        assert frames.shape == (4, 3, size, size) and frames.dtype == torch.float32
        assert torch.equal(frames[0], before) and torch.equal(frames[-1], after)
        assert torch.equal(frames[1:3], source.frames_at(pair, [1 / 3, 2 / 3], size))
        if torch.equal(before, after):  # a still distractor: every state in between is the same image
            assert all(torch.equal(middle, before) for middle in frames[1:3]), pair.id
            continue
        # the keyframes are states in between: neither end (every other pair here changes its view)
        for middle in frames[1:3]:
            assert not torch.equal(middle, before) and not torch.equal(middle, after), pair.id


def test_truth_keyframes_are_the_rendered_states_at_evenly_spaced_times(jittered_root):
    pair = next(p for p in load_split("clevr-change", jittered_root, "train") if p.change_type == "move")
    index = int(pair.id.split("_")[-1].split(".")[0])
    cache = ImageCache(16)
    frames = TruthProcedures(jittered_root, 3)(pair, cache(pair.before_path), cache(pair.after_path))
    for i, t in enumerate((0.25, 0.5, 0.75), start=1):
        expected = torch.from_numpy(render_intermediate(jittered_root, index, t)).permute(2, 0, 1).float() / 255.0
        assert torch.equal(frames[i], expected)
    assert TruthProcedures(jittered_root, 0)(pair, cache(pair.before_path), cache(pair.after_path)).shape[0] == 2


def test_truth_refuses_what_is_not_a_synthetic_benchmark(tmp_path, jittered_root):
    with pytest.raises(ProCapError, match="--data"):
        make_procedure_source("truth", 2, None)
    with pytest.raises(ProCapError, match="holds no scenes.json"):
        make_procedure_source("truth", 2, str(tmp_path))
    pair = load_split("clevr-change", jittered_root, "train")[0]
    stranger = type(pair)("photo_1.png", pair.before_path, tmp_path / "photo_1.png", ["x"], None)
    with pytest.raises(ProCapError, match="photo_1.png"):
        TruthProcedures(jittered_root, 2)(stranger, torch.zeros(3, 16, 16), torch.zeros(3, 16, 16))


def test_pretrain_on_truth_procedures(tmp_path, jittered_root, monkeypatch):
    from procap.commands.cli import main
    from procap.train import stage1

    # the 16 px test model whatever the preset (the preset is still recorded)
    monkeypatch.setattr(
        stage1, "new_model", lambda preset, vocab, vqgan, **kw: ProCap(small_training_config(len(vocab), **kw))
    )
    out = tmp_path / "run"
    argv = ["pretrain", "--data", str(jittered_root), "--out", str(out), "--preset", "tiny", "--procedures", "truth"]
    assert main([*argv, "--steps", "2", "--batch-size", "4", "--log-every", "1", "--no-progress"]) == 0
    losses = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in losses if "loss" in r] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in losses if "loss" in r)
    assert json.loads((out / "stage1_config.json").read_text())["procedures"] == "truth"
