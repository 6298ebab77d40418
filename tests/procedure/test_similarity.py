from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from procap.core.errors import ProCapError
from procap.procedure.similarity import DINOv2Similarity, ScoreFileSimilarity, VQGANSimilarity
from tests.support import tiny_vqgan


def test_vqgan_similarity_self_is_one_and_batched_matches():
    sim = VQGANSimilarity(tiny_vqgan())
    frames = torch.rand(2, 5, 3, 32, 32)
    s_bef, s_aft = sim(frames)
    assert s_bef.shape == s_aft.shape == (2, 5)
    torch.testing.assert_close(s_bef[:, 0], torch.ones(2))
    torch.testing.assert_close(s_aft[:, -1], torch.ones(2))
    one_bef, _one_aft = sim(frames[1])
    torch.testing.assert_close(one_bef, s_bef[1], atol=1e-5, rtol=1e-5)


def test_score_file_clevr_nested_and_flat(tmp_path):
    scores = {
        "000001.png": {
            "sc_sim_matrixes": {"bef_inter_sim": [[1, 2, 3], [3, 4, 5]], "inter_aft_sim": [[0, 0, 0], [2, 2, 2]]},
            "nsc_sim_matrixes": {"bef_inter_sim": [[9, 9, 9]], "inter_aft_sim": [[1, 1, 1]]},
        },
        "77": {"bef_inter_sim": [[1, 1, 1]], "inter_aft_sim": [[0, 1, 0]]},
    }
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(scores))
    sim = ScoreFileSimilarity(path)
    s_bef, s_aft = sim(None, ("sc", "000001.png"))
    torch.testing.assert_close(s_bef, torch.tensor([2.0, 3.0, 4.0]))  # averaged over the two captions
    torch.testing.assert_close(s_aft, torch.tensor([1.0, 1.0, 1.0]))
    assert sim(None, ("nsc", "000001.png"))[0].tolist() == [9, 9, 9]
    assert sim(None, "77")[1].tolist() == [0, 1, 0]
    with pytest.raises(ProCapError, match="no entry"):
        sim(None, "missing")
    with pytest.raises(ProCapError, match="frames"):
        sim(torch.zeros(9, 3, 4, 4), "77")


def test_score_file_errors(tmp_path):
    with pytest.raises(ProCapError, match="does not exist"):
        ScoreFileSimilarity(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProCapError, match="not valid JSON"):
        ScoreFileSimilarity(bad)


def test_dinov2_without_timm_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm -> ImportError
    with pytest.raises(ProCapError, match="timm"):
        DINOv2Similarity(tmp_path / "w.pth")


def test_dinov2_wiring_with_a_stand_in_timm(monkeypatch, tmp_path):
    """Weights are loaded from the user's file, images normalised and resized, CLS embedding compared."""

    class FakeViT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(3, 8)
            self.seen = None

        def forward(self, x):
            self.seen = x.shape
            return self.proj(x.mean(dim=(2, 3)))

    fake = types.ModuleType("timm")
    fake.create_model = lambda name, **kw: FakeViT()
    monkeypatch.setitem(sys.modules, "timm", fake)
    monkeypatch.setitem(sys.modules, "timm.models", None)  # no checkpoint_filter_fn: used as is
    weights = tmp_path / "w.pth"
    torch.save(FakeViT().state_dict(), weights)
    sim = DINOv2Similarity(weights, image_size=28)
    torch.testing.assert_close(sim.model.proj.weight, torch.load(weights)["proj.weight"])
    s_bef, _s_aft = sim(torch.rand(4, 3, 16, 16))
    assert sim.model.seen[-2:] == (28, 28)
    torch.testing.assert_close(s_bef[0], torch.tensor(1.0))
    with pytest.raises(ProCapError, match="multiple of 14"):
        DINOv2Similarity(weights, image_size=30)
