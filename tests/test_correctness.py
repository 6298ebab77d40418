"""Caption correctness: the template grammar, synonyms, and the accuracy figures built on it."""

from __future__ import annotations

import random

import pytest

from procap.data.synthetic import TEMPLATES
from procap.eval.correctness import NO_CHANGE, PairTruth, caption_accuracy, parse_caption, scene_truths

OBJECT = {"size": "small", "color": "red", "material": "metal", "shape": "cube"}
NEW = {"color": "blue", "material": "rubber"}


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_every_template_parses_to_its_fields(kind: str) -> None:
    for template in TEMPLATES[kind]:
        text = template.format(obj="small red metal cube", new=NEW.get(kind, ""))
        parsed = parse_caption(text)
        assert parsed.type == kind, text
        if kind == NO_CHANGE:
            assert parsed.object is None
            continue
        assert parsed.object == OBJECT, text
        expected_new = NEW[kind] if "{new}" in template else None
        assert parsed.new_value == expected_new, text


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        (
            "the tiny red shiny block moved",
            "object",
            {"size": "small", "color": "red", "material": "metal", "shape": "cube"},
        ),
        (
            "the big grey matte ball is gone",
            "object",
            {"size": "large", "color": "gray", "material": "rubber", "shape": "sphere"},
        ),
        ("The small red metal cube changed to BLUE.", "new_value", "blue"),
        ("the small red metal cube became metallic", "new_value", "metal"),
        ("the small red metal cube became metallic", "type", "material"),
        ("the small red metal cube changed to blue", "type", "color"),
    ],
)
def test_synonyms_case_and_punctuation(text: str, field: str, value) -> None:
    assert getattr(parse_caption(text), field) == value


@pytest.mark.parametrize(
    "text", ["the small", "", "a cube", "the small red metal cube changed to happy", "the small red metal dog moved"]
)
def test_ungrammatical_captions_do_not_count_as_right(text: str) -> None:
    parsed = parse_caption(text)
    truth = PairTruth("move", dict(OBJECT))
    result = caption_accuracy({"a": text}, {"a": truth})
    assert result["type"] in (0.0, 1.0)
    assert result["object"] == 0.0
    assert parsed.type in (None, "move")


def test_wrong_object_wrong_type_and_no_change() -> None:
    truths = {
        "right": PairTruth("color", dict(OBJECT), "blue"),
        "wrong_colour": PairTruth("color", dict(OBJECT), "blue"),
        "wrong_type": PairTruth("drop", dict(OBJECT)),
        "missed": PairTruth("add", dict(OBJECT)),
        "quiet": PairTruth(NO_CHANGE),
        "false_alarm": PairTruth(NO_CHANGE),
    }
    predictions = {
        "right": "the small red metal cube turned blue",
        "wrong_colour": "the small green metal cube turned yellow",
        "wrong_type": "the small red metal cube moved",
        "missed": "nothing has changed",
        "quiet": "the scene remains the same",
        "false_alarm": "the small red metal cube moved",
    }
    acc = caption_accuracy(predictions, truths)
    assert acc["change"] == pytest.approx(4 / 6)  # 'missed' and 'false_alarm' are wrong
    assert acc["type"] == pytest.approx(2 / 4)  # right, wrong_colour (still a colour change)
    assert acc["object"] == pytest.approx(2 / 4)  # right and wrong_type name the right object
    assert acc["new_value"] == pytest.approx(1 / 2)
    assert acc["distinct"] == pytest.approx(4 / 4)
    assert acc["per_type"]["color"]["object"] == pytest.approx(1 / 2)
    # wrong_colour names a green cube (colour wrong, the rest right); 'missed' names no object at all.
    assert acc["attributes"] == pytest.approx({"size": 3 / 4, "color": 2 / 4, "material": 3 / 4, "shape": 3 / 4})
    assert acc["per_type"][NO_CHANGE]["change"] == pytest.approx(1 / 2)


def test_one_caption_for_every_pair_is_not_distinct() -> None:
    truths = {f"p{i}": PairTruth("move", dict(OBJECT)) for i in range(10)}
    acc = caption_accuracy({k: "the small red metal cube moved" for k in truths}, truths)
    assert acc["distinct"] == pytest.approx(0.1)
    assert acc["object"] == 1.0


def test_scene_truths_from_a_generated_benchmark(tmp_path) -> None:
    from procap.data import load_split
    from procap.data.synthetic import generate

    generate(tmp_path, 15, size=32, seed=3, progress=False)
    pairs = load_split("clevr-change", tmp_path, "train")
    truths = scene_truths(tmp_path, pairs)
    assert set(truths) == {p.id for p in pairs}
    # Every reference caption of the benchmark is right about everything it names.
    predictions = {p.id: random.Random(0).choice(p.captions) for p in pairs}
    acc = caption_accuracy(predictions, truths)
    assert acc["change"] == 1.0 and acc["type"] == 1.0 and acc["object"] == 1.0
    assert acc["unparsed"] == 0
    changed = [p for p in pairs if p.change_type != NO_CHANGE]
    assert all(truths[p.id].object is not None for p in changed)
    # Without scenes.json only change and type are known.
    (tmp_path / "scenes.json").unlink()
    bare = caption_accuracy(predictions, scene_truths(tmp_path, pairs))
    assert bare["object"] is None and bare["type"] == 1.0
