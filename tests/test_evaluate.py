import json

import pytest

from procap.errors import ProCapError
from procap.eval import metrics

REFS = {
    "a": ["the red cube moved", "the red cube changed its location"],
    "b": ["no change was made", "nothing has changed"],
    "c": ["the blue sphere turned green", "the blue sphere became green"],
    "d": ["the small cylinder is gone", "the small cylinder was removed"],
}
FAST = ["bleu", "rouge", "cider"]


def test_perfect_predictions_beat_wrong_ones():
    perfect = {k: v[0] for k, v in REFS.items()}
    wrong = {k: "a purple elephant sat down" for k in REFS}
    good, bad = metrics.score(perfect, REFS, FAST), metrics.score(wrong, REFS, FAST)
    assert good["Bleu_4"] > 0.9 and good["ROUGE_L"] > 0.9 and good["CIDEr"] > 1.0
    assert bad["Bleu_4"] < 0.1 and bad["CIDEr"] < good["CIDEr"] / 5


def test_breakdown_by_change_type():
    types = {"a": "move", "b": "no_change", "c": "color", "d": "drop"}
    result = metrics.score({k: v[0] for k, v in REFS.items()}, REFS, FAST, change_types=types)
    groups = result["by_type"]
    assert {"move", "no_change", "color", "drop", "change", "total"} <= set(groups)
    assert groups["change"]["count"] == 3 and groups["no_change"]["count"] == 1 and groups["total"]["count"] == 4
    assert groups["total"]["Bleu_4"] == pytest.approx(result["Bleu_4"])


def test_meteor_runs_with_java_and_says_how_to_fix_without(monkeypatch):
    if metrics.java_available():
        assert metrics.score({"a": "the red cube moved"}, REFS, ["meteor"])["METEOR"] > 0.5
    monkeypatch.setattr(metrics, "java_available", lambda: False)
    with pytest.raises(ProCapError, match="Java"):
        metrics.score({"a": "the red cube moved"}, REFS, ["meteor"])
    # without Java the other metrics still work through the fallback tokenizer
    assert metrics.score({k: v[0] for k, v in REFS.items()}, REFS, FAST)["Bleu_4"] > 0.9


def test_bad_inputs():
    with pytest.raises(ProCapError, match="no references"):
        metrics.score({"zzz": "x"}, REFS, FAST)
    with pytest.raises(ProCapError, match="unknown metric"):
        metrics.score({"a": "x"}, REFS, ["spice"])


def test_result_files_round_trip(tmp_path):
    preds = {"a": "the cube moved", "b": "nothing"}
    metrics.write_results(tmp_path / "res.json", preds)
    assert json.loads((tmp_path / "res.json").read_text())[0] == {"image_id": "a", "caption": "the cube moved"}
    assert metrics.read_predictions(tmp_path / "res.json") == preds
    (tmp_path / "refs.json").write_text(json.dumps({"a": "one ref", "b": ["x", "y"]}))
    assert metrics.read_references(tmp_path / "refs.json") == {"a": ["one ref"], "b": ["x", "y"]}


def test_metric_names_accept_result_keys():
    preds = {k: v[0] for k, v in REFS.items()}
    assert set(metrics.score(preds, REFS, ["Bleu_4", "CIDEr"])) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"}


def test_fallback_tokenizer_matches_ptb_on_simple_captions(monkeypatch):
    texts = {"x": ["The red cube isn't there.", "Gonna move, ok?"]}
    java = metrics._tokenize(texts) if metrics.java_available() else None
    monkeypatch.setattr(metrics, "java_available", lambda: False)
    ours = metrics._tokenize(texts)
    assert ours == {"x": ["the red cube is n't there", "gon na move ok"]}
    if java is not None:
        assert java == ours


@pytest.mark.parametrize(
    "spellings,name",
    [
        (["BLEU-4", "bleu", "Bleu_4", "bleu4", "BLEU 4"], "BLEU-4"),
        (["ROUGE-L", "rouge", "ROUGE_L", "rouge-l"], "ROUGE-L"),
        (["CIDEr", "cider", "CIDEr-D", "CIDER_D"], "CIDEr"),
        (["METEOR", "meteor"], "METEOR"),
    ],
)
def test_metric_name_spellings(spellings, name):
    assert {metrics.metric_name(s) for s in spellings} == {name}
    assert name in metrics.METRIC_TABLE


def test_metric_names_drop_duplicates_and_reject_unknown():
    assert metrics.metric_names(["cider", "CIDEr-D", "bleu"]) == ["CIDEr", "BLEU-4"]
    with pytest.raises(ProCapError, match="unknown metric 'spice'"):
        metrics.metric_names(["spice"])
