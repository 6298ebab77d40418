"""`procap score` inputs: captions with line breaks stay on their own references, malformed prediction and
reference files are one sentence, references can come straight from a dataset split; property-based checks."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from procap.commands.cli import main
from procap.core.errors import ProCapError
from procap.eval import metrics

REFS = {"a": ["the red cube moved away"], "b": ["the small blue sphere has disappeared now"]}
# Every character the Stanford tokenizer (or Python) treats as a line break or as whitespace.
BREAKS = ["\r", "\n", "\r\n", "\x0b", "\x0c", "\x85", "\u2028", "\u2029", "\t", "\xa0"]


@pytest.mark.parametrize("brk", BREAKS, ids=[repr(b) for b in BREAKS])
def test_a_line_break_inside_a_caption_does_not_shift_the_references(brk):
    """A line break ('\\r' included) inside a caption adds no tokenizer line: two perfect captions score BLEU-4 1.0."""
    predictions = {"a": f"the red cube{brk}moved away", "b": REFS["b"][0]}
    scores = metrics.score(predictions, REFS, ["bleu", "rouge"])
    assert scores["Bleu_4"] == pytest.approx(1.0, abs=1e-6)
    assert scores["ROUGE_L"] == pytest.approx(1.0)


def test_references_with_line_breaks_and_empty_captions_keep_their_ids():
    refs = {"a": ["the red\rcube moved away", ""], "b": ["", "the small blue sphere\u2028has disappeared now"]}
    scores = metrics.score({k: v for k, v in (("a", REFS["a"][0]), ("b", REFS["b"][0]))}, refs, ["rouge"])
    assert scores["ROUGE_L"] == pytest.approx(1.0)


def test_a_string_reference_is_one_reference_in_the_python_api_as_in_files():
    """score({"a": ...}, {"a": "the red cube moved away"}) scores against that one sentence, not each character."""
    as_string = metrics.score({"a": REFS["a"][0]}, {"a": REFS["a"][0]}, ["bleu"])
    assert as_string["Bleu_4"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "references, message",
    [
        ({"a": ["", "  "]}, "no reference caption for id 'a'"),
        ({"a": []}, "no reference caption for id 'a'"),
        ({"a": [3]}, "non-caption value for id 'a'"),
        ({"a": None}, "non-caption value for id 'a'"),
    ],
)
def test_references_that_cannot_be_scored_against_are_refused(references, message):
    """References that cannot be scored against (blank ones...) are refused with one sentence."""
    with pytest.raises(ProCapError, match=message):
        metrics.score({"a": "the cube moved"}, references, ["bleu"])


def test_a_reference_file_naming_an_id_twice_is_refused(tmp_path):
    path = tmp_path / "refs.json"
    path.write_text('{"a": ["the cube moved"], "a": ["a sphere"]}')
    with pytest.raises(ProCapError, match=f"{path} names the key 'a' twice"):
        metrics.read_references(path)


@pytest.mark.skipif(not metrics.java_available(), reason="the Stanford tokenizer needs Java")
def test_a_tokenizer_that_returns_the_wrong_number_of_lines_is_an_error(monkeypatch):
    real_run = subprocess.run

    def one_line_too_many(command, **kwargs):
        done = real_run(command, **kwargs)
        return subprocess.CompletedProcess(done.args, 0, b"extra\n" + done.stdout, done.stderr)

    monkeypatch.setattr(subprocess, "run", one_line_too_many)
    with pytest.raises(ProCapError, match="3 lines for 2 captions"):
        metrics.score({"a": REFS["a"][0]}, REFS, ["bleu"])


@pytest.mark.parametrize(
    "content,message",
    [
        ([{"image_id": "a", "caption": None}], "not a string"),
        ([{"image_id": "a", "caption": "x"}, {"image_id": "a", "caption": "y"}], "two captions for id 'a'"),
        ([{"image_id": ["a"], "caption": "x"}], "neither a string nor an integer"),
        ({"a": 3}, "not a string"),
        ("the cube", "must be a COCO result list"),
    ],
)
def test_prediction_files_with_wrong_types_name_the_file(tmp_path, content, message):
    """A null caption or an id given twice is refused with one sentence naming the file."""
    path = tmp_path / "pred.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ProCapError, match=message) as info:
        metrics.read_predictions(path)
    assert str(path) in str(info.value)


def test_integer_ids_match_string_references(tmp_path):
    path = tmp_path / "pred.json"
    path.write_text(json.dumps([{"image_id": 7, "caption": "x"}]))
    assert metrics.read_predictions(path) == {"7": "x"}


def test_score_takes_references_from_a_dataset_split(tmp_path, monkeypatch, capsys):
    """`procap score --dataset --root --split` scores against the loader's references, per type on CLEVR."""
    monkeypatch.chdir(tmp_path)
    from procap.data import load_split
    from procap.data.synthetic import generate

    generate(tmp_path / "data", 12, size=16, seed=2, progress=False)
    pairs = load_split("clevr-change", tmp_path / "data", "test")
    (tmp_path / "pred.json").write_text(json.dumps([{"image_id": p.id, "caption": p.captions[0]} for p in pairs]))
    (tmp_path / "refs.json").write_text(json.dumps({p.id: p.captions for p in pairs}))
    base = ["score", "--pred", str(tmp_path / "pred.json"), "--metrics", "bleu,cider"]
    assert main([*base, "--dataset", "clevr-change", "--root", str(tmp_path / "data"), "--out", "a.json"]) == 0
    assert main([*base, "--refs", str(tmp_path / "refs.json"), "--out", "b.json"]) == 0
    from_split, from_file = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert from_split["BLEU-4"] == pytest.approx(from_file["BLEU-4"]) and from_split["BLEU-4"] > 90
    assert {"total", "change", "no_change"} <= set(from_split["by_type"])


# ------------------------------------------------------------------------------------------ properties
_WORDS = st.sampled_from(["the", "red", "cube", "moved", "a", "sphere", "is", "gone", "blue", "it's", "3.5"])
_SPACES = st.lists(st.sampled_from([" ", *BREAKS]), min_size=1, max_size=3).map("".join)


@st.composite
def _caption(draw) -> str:
    words = draw(st.lists(_WORDS, min_size=1, max_size=7))
    gaps = draw(st.lists(_SPACES, min_size=len(words) + 1, max_size=len(words) + 1))
    return gaps[0] + "".join(w + g for w, g in zip(words, gaps[1:]))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_caption(), min_size=2, max_size=6))
def test_every_caption_is_scored_against_its_own_references(captions):
    """Whatever whitespace a caption holds, a prediction equal to its reference scores ROUGE-L 1 for every id."""
    refs = {f"id{i}": [c] for i, c in enumerate(captions)}
    preds = {k: v[0] for k, v in refs.items()}
    assert metrics.score(preds, refs, ["rouge"])["ROUGE_L"] == pytest.approx(1.0)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_PREDICTION_LIKE = st.lists(st.fixed_dictionaries({"image_id": _JSON, "caption": _JSON}), max_size=4) | st.dictionaries(
    st.text(max_size=6), _JSON, max_size=4
)


@settings(max_examples=80, deadline=None)
@given(st.one_of(_JSON, _PREDICTION_LIKE))
def test_prediction_and_reference_files_load_or_fail_with_one_sentence(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("json") / "file.json"
    path.write_text(json.dumps(data))
    for reader in (metrics.read_predictions, metrics.read_references):
        try:
            loaded = reader(path)
        except ProCapError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc)
            continue
        assert all(isinstance(k, str) for k in loaded)
        values = loaded.values() if reader is metrics.read_predictions else (c for v in loaded.values() for c in v)
        assert all(isinstance(v, str) for v in values)
