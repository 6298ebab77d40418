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
    assert main(["score", "--pred", pred, "--refs", refs, "--metrics", "bleu,bleu5"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'bleu5'" in err and "\n" not in err.strip()


def test_evaluate_rejects_an_unknown_metric_before_loading_anything(tmp_path, capsys):
    argv = ["evaluate", "--ckpt", str(tmp_path / "none.safetensors"), "--data", str(tmp_path), "--metrics", "BLEU-5"]
    assert main(argv) == 2
    assert "--metrics: unknown metric 'BLEU-5'" in capsys.readouterr().err


def test_evaluate_refuses_a_metric_this_machine_cannot_compute_before_loading_anything(tmp_path, capsys, monkeypatch):
    from procap.eval import metrics

    monkeypatch.setattr(metrics, "java_available", lambda: False)
    argv = ["evaluate", "--ckpt", str(tmp_path / "none.safetensors"), "--data", str(tmp_path), "--metrics", "spice"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "procap: error: --metrics: SPICE cannot run here: it needs Java (install a JRE, e.g. `apt-get install default-jre-headless`)."
    )


def test_evaluate_accepts_spellings_then_needs_the_checkpoint(tmp_path, capsys):
    argv = ["evaluate", "--ckpt", str(tmp_path / "none.safetensors"), "--data", str(tmp_path)]
    assert main([*argv, "--metrics", "bleu-4", "rouge_l", "cider"]) == 2
    err = capsys.readouterr().err
    assert "metric" not in err and "none.safetensors" in err
