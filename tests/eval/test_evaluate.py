import json
from pathlib import Path

import pytest

from procap.core.errors import ProCapError
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
        metrics.score({"a": "x"}, REFS, ["bleu5"])


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
        (["BLEU-1", "Bleu_1", "bleu1", "bleu-1"], "BLEU-1"),
        (["BLEU-2", "Bleu_2"], "BLEU-2"),
        (["BLEU-3", "bleu_3"], "BLEU-3"),
        (["SPICE", "spice"], "SPICE"),
    ],
)
def test_metric_name_spellings(spellings, name):
    assert {metrics.metric_name(s) for s in spellings} == {name}
    assert name in metrics.METRIC_TABLE


def test_metric_names_drop_duplicates_and_reject_unknown():
    assert metrics.metric_names(["cider", "CIDEr-D", "bleu"]) == ["CIDEr", "BLEU-4"]
    with pytest.raises(ProCapError, match="unknown metric 'bleu5'"):
        metrics.metric_names(["bleu5"])


def test_the_metric_table_holds_the_fields_metrics():
    # LEVIR-CC tables report BLEU-1..4, METEOR, ROUGE-L and CIDEr; CLEVR-Change tables add SPICE.
    assert metrics.METRICS == ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr", "SPICE")
    assert [metrics.METRIC_TABLE[f"BLEU-{n}"] for n in (1, 2, 3, 4)] == [("bleu", f"Bleu_{n}") for n in (1, 2, 3, 4)]


def test_bleu_one_to_four_are_scored_and_displayed(monkeypatch):
    from procap.data import ChangePair
    from procap.eval.split import score_captions

    pairs = [ChangePair(k, "b.png", "a.png", v, None) for k, v in REFS.items()]
    predictions = {k: v[0] for k, v in REFS.items()}
    shown = score_captions(predictions, pairs, ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "CIDEr"])
    assert list(shown) == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "CIDEr"]
    assert shown["BLEU-1"] >= shown["BLEU-2"] >= shown["BLEU-3"] >= shown["BLEU-4"] > 90
    table = metrics.format_table(metrics.paper_scale(metrics.score(predictions, REFS, ["bleu", "cider"])))
    assert table.splitlines()[0].split() == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "CIDEr"]


def test_without_java_meteor_and_spice_are_skipped_with_one_line(monkeypatch):
    monkeypatch.setattr(metrics, "java_available", lambda: False)
    names, note = metrics.available_metrics()
    assert names == ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr")
    assert note.count("\n") == 0 and note.startswith("METEOR and SPICE skipped: it needs Java")
    with pytest.raises(ProCapError, match="SPICE cannot run here: it needs Java"):
        metrics.score({"a": "the red cube moved"}, REFS, ["spice"])


def test_spice_without_its_corenlp_jars_is_skipped_and_never_downloaded(monkeypatch, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "spice-1.0.jar").write_bytes(b"")
    monkeypatch.setattr(metrics, "java_available", lambda: True)
    monkeypatch.setattr(metrics, "_spice_folder", lambda: tmp_path)
    names, note = metrics.available_metrics(["cider", "spice"])
    assert names == ("CIDEr",) and note.startswith("SPICE skipped: it needs Stanford CoreNLP 3.6.0 in")


def test_spice_scores_are_read_as_pycocoevalcap_averages_them(monkeypatch, tmp_path):
    """The java run is replaced by one that writes SPICE's output format; a caption without a scene graph (NaN)
    counts as not scored."""
    pytest.importorskip("pycocoevalcap", reason="the [eval] extra (pycocoevalcap) is not installed")
    (tmp_path / "lib").mkdir()
    for jar in ("spice-1.0.jar", "lib/stanford-corenlp-3.6.0.jar"):
        (tmp_path / jar).write_bytes(b"")
    monkeypatch.setattr(metrics, "java_available", lambda: True)
    monkeypatch.setattr(metrics, "_spice_folder", lambda: tmp_path)
    monkeypatch.setattr(metrics, "_tokenize", lambda texts: texts)  # no Java needed for this test's tokens
    run = metrics.subprocess.run
    f_scores = {"a": 0.5, "b": "NaN", "c": 0.25, "d": 0.75}

    def fake_java(command, **options):
        if command[:4] != ["java", "-jar", "-Xmx8G", "spice-1.0.jar"]:
            return run(command, **options)
        entries = json.loads(Path(command[4]).read_text())
        written = [{"image_id": e["image_id"], "scores": {"All": {"f": f_scores[e["image_id"]]}}} for e in entries]
        Path(command[command.index("-out") + 1]).write_text(json.dumps(written))
        return metrics.subprocess.CompletedProcess(command, 0, b"", b"")

    monkeypatch.setattr(metrics.subprocess, "run", fake_java)
    result = metrics.score({k: v[0] for k, v in REFS.items()}, REFS, ["spice"])
    assert result == {"SPICE": pytest.approx(0.5)}
