"""`procap score` and `procap evaluate` accept every common spelling of the metric names."""

from __future__ import annotations

import json

import pytest

from procap.cli import main


def _files(tmp_path):
    (tmp_path / "pred.json").write_text(json.dumps({"1": "the cube moved", "2": "nothing changed"}))
    (tmp_path / "refs.json").write_text(json.dumps({"1": ["the cube moved"], "2": ["nothing changed"]}))
    return str(tmp_path / "pred.json"), str(tmp_path / "refs.json")


@pytest.mark.parametrize("metrics", ["BLEU-4,ROUGE-L,CIDEr", "bleu,rouge,cider", "Bleu_4,ROUGE_L,CIDEr-D"])
def test_score_accepts_spellings(tmp_path, metrics):
    pred, refs = _files(tmp_path)
    out = tmp_path / "m.json"
    assert main(["score", "--pred", pred, "--refs", refs, "--metrics", metrics, "--out", str(out)]) == 0
    assert set(json.loads(out.read_text())) >= {"Bleu_4", "ROUGE_L", "CIDEr"}


def test_score_unknown_metric_exits_2(tmp_path, capsys):
    pred, refs = _files(tmp_path)
    assert main(["score", "--pred", pred, "--refs", refs, "--metrics", "bleu,spice"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'spice'" in err and "\n" not in err.strip()


def test_evaluate_rejects_an_unknown_metric_before_loading_anything(tmp_path, capsys):
    argv = ["evaluate", "--ckpt", str(tmp_path / "none.safetensors"), "--data", str(tmp_path), "--metrics", "SPICE"]
    assert main(argv) == 2
    assert "--metrics: unknown metric 'SPICE'" in capsys.readouterr().err


def test_evaluate_accepts_spellings_then_needs_the_checkpoint(tmp_path, capsys):
    argv = ["evaluate", "--ckpt", str(tmp_path / "none.safetensors"), "--data", str(tmp_path)]
    assert main([*argv, "--metrics", "bleu-4", "rouge_l", "cider"]) == 2
    err = capsys.readouterr().err
    assert "metric" not in err and "none.safetensors" in err
