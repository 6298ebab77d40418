"""One spelling rule for metric names (issue 41, item 7): `procap score`, `procap evaluate` and the library read every
documented spelling through `procap.eval.metrics.metric_names`, and both commands print scores x100, as the papers
do, in their tables and their JSON alike."""

from __future__ import annotations

import json

import pytest

from procap.commands.cli import main
from procap.core.errors import ProCapError
from procap.eval.metrics import metric_names, paper_scale

# (how a user writes the list: one string or the words of an nargs="+" option, the names it means)
SPELLINGS = [
    ("bleu,cider", ["BLEU-4", "CIDEr"]),
    ("BLEU-4 CIDEr", ["BLEU-4", "CIDEr"]),
    (["BLEU-4", "CIDEr"], ["BLEU-4", "CIDEr"]),
    (["bleu,cider"], ["BLEU-4", "CIDEr"]),
    ("BLEU-4, CIDEr", ["BLEU-4", "CIDEr"]),
    ("BLEU-4,ROUGE-L,CIDEr", ["BLEU-4", "ROUGE-L", "CIDEr"]),
    ("bleu,rouge,cider", ["BLEU-4", "ROUGE-L", "CIDEr"]),
    ("Bleu_4,ROUGE_L,CIDEr-D", ["BLEU-4", "ROUGE-L", "CIDEr"]),
    ("bleu-1 Bleu_2 BLEU3 bleu-4", ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"]),
    ("BLEU 4, ROUGE L, CIDEr D", ["BLEU-4", "ROUGE-L", "CIDEr"]),
    ("METEOR spice", ["METEOR", "SPICE"]),
    ("rouge-l ROUGE_L rouge", ["ROUGE-L"]),
    ("CIDER,cider,CIDEr", ["CIDEr"]),
    ("  bleu ,, cider  ", ["BLEU-4", "CIDEr"]),
    ("", []),
]


@pytest.mark.parametrize("written,names", SPELLINGS, ids=[repr(w) for w, _ in SPELLINGS])
def test_one_reading_of_metric_lists(written, names):
    assert metric_names(written) == names


@pytest.mark.parametrize("written", ["bleu5", "BLEU-4 CIDEr blue", "bleu,precision", "4", "BLEU-4,,L2"])
def test_unknown_names_are_refused(written):
    with pytest.raises(ProCapError, match="unknown metric"):
        metric_names(written)


def _files(tmp_path):
    (tmp_path / "pred.json").write_text(json.dumps({"1": "the cube moved", "2": "nothing changed"}))
    (tmp_path / "refs.json").write_text(json.dumps({"1": ["the cube moved"], "2": ["nothing changed"]}))
    return str(tmp_path / "pred.json"), str(tmp_path / "refs.json")


# the words after --metrics on the command line
COMMAND_SPELLINGS = [
    ["BLEU-4,ROUGE-L,CIDEr"],
    ["bleu,rouge,cider"],
    ["Bleu_4,ROUGE_L,CIDEr-D"],
    ["BLEU-4", "ROUGE-L", "CIDEr"],
    ["BLEU-4 ROUGE-L CIDEr"],
    ["bleu,rouge", "cider"],
]


@pytest.mark.parametrize("words", COMMAND_SPELLINGS, ids=" ".join)
def test_score_accepts_every_spelling_and_prints_one_scale(tmp_path, capsys, words):
    pred, refs = _files(tmp_path)
    out = tmp_path / "m.json"
    assert main(["score", "--pred", pred, "--refs", refs, "--metrics", *words, "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert set(written) >= {"BLEU-4", "ROUGE-L", "CIDEr"} and "Bleu_4" not in written
    assert written["ROUGE-L"] == pytest.approx(100.0)  # identical captions: x100, as in the table
    header, row = capsys.readouterr().out.splitlines()[:2]
    table = dict(zip(header.split(), (float(v) for v in row.split()[1:]), strict=True))
    for name, value in table.items():
        assert value == pytest.approx(written[name], abs=0.05), name  # the table and the JSON on one scale


def test_score_prints_the_same_scale_on_stdout(tmp_path, capsys):
    pred, refs = _files(tmp_path)
    assert main(["score", "--pred", pred, "--refs", refs, "--metrics", "bleu", "cider"]) == 0
    lines = capsys.readouterr().out.splitlines()
    shown = json.loads(lines[-1])
    row = dict(zip(lines[0].split(), (float(v) for v in lines[1].split()[1:]), strict=True))
    assert row["CIDEr"] == pytest.approx(shown["CIDEr"], abs=0.05) and row["BLEU-4"] == pytest.approx(
        shown["BLEU-4"], abs=0.05
    )


def test_paper_scale_names_and_scales_every_group():
    raw = {"Bleu_4": 0.5, "CIDEr": 3.0998, "coverage": {"scored": 2}, "by_type": {"total": {"CIDEr": 1.0, "count": 2}}}
    shown = paper_scale(raw)
    assert shown == {
        "BLEU-4": 50.0,
        "CIDEr": pytest.approx(309.98),
        "coverage": {"scored": 2},
        "by_type": {"total": {"CIDEr": 100.0, "count": 2}},
    }


def test_score_unknown_metric_exits_2(tmp_path, capsys):
    pred, refs = _files(tmp_path)
    assert main(["score", "--pred", pred, "--refs", refs, "--metrics", "bleu,bleu5"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'bleu5'" in err and "--metrics" in err and "\n" not in err.strip()


@pytest.mark.parametrize("words", [["BLEU-5"], ["bleu,cider5"], ["BLEU-4", "CIDEr", "blue"]], ids=" ".join)
def test_evaluate_rejects_an_unknown_metric_before_loading_anything(tmp_path, capsys, words):
    argv = ["evaluate", "--ckpt", str(tmp_path / "none.safetensors"), "--data", str(tmp_path), "--metrics", *words]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--metrics {' '.join(words)!r}: unknown metric" in err and "none.safetensors" not in err


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


@pytest.mark.parametrize("words", COMMAND_SPELLINGS, ids=" ".join)
def test_evaluate_accepts_every_spelling_then_needs_the_checkpoint(tmp_path, capsys, words):
    argv = ["evaluate", "--ckpt", str(tmp_path / "none.safetensors"), "--data", str(tmp_path)]
    assert main([*argv, "--metrics", *words]) == 2
    err = capsys.readouterr().err
    assert "metric" not in err and "none.safetensors" in err


def test_both_help_texts_describe_the_same_rule(capsys):
    from procap.eval.metrics import METRICS_SPELLING_HELP

    for command in ("score", "evaluate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert " ".join(METRICS_SPELLING_HELP.split()) in " ".join(capsys.readouterr().out.split())
