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
    # the failure kinds apart: 'missed' says no change, 'false_alarm' names one
    assert acc["miss_rate"] == pytest.approx(1 / 4) and acc["false_positive_rate"] == pytest.approx(1 / 2)
    assert acc["confusion"]["add"] == {NO_CHANGE: 1} and acc["confusion"][NO_CHANGE] == {NO_CHANGE: 1, "move": 1}
    assert acc["move_as_add_drop"] is None  # no move pair to count


def test_garbage_captions_score_no_change_detection() -> None:
    # An unparsed caption used to count as "change detected": garbage scored 100 % on the change pairs.
    truths = {f"c{i}": PairTruth(kind, dict(OBJECT)) for i, kind in enumerate(("color", "add", "drop", "move"))}
    truths |= {f"n{i}": PairTruth(NO_CHANGE) for i in range(4)}
    garbage = ["purple purple purple", "", "the the the", "cube cube", "moved the", "a", "red", "xyz"]
    acc = caption_accuracy(dict(zip(truths, garbage)), truths)
    assert acc["change"] == 0.0 and acc["type"] == 0.0 and acc["object"] == 0.0
    assert acc["per_type"]["color"]["change"] == 0.0
    assert (acc["unparsed"], acc["unparsed_changes"], acc["unparsed_distractors"]) == (8, 4, 4)
    # unparsed is its own failure kind: neither a miss nor a false alarm
    assert acc["miss_rate"] == 0.0 and acc["false_positive_rate"] == 0.0
    assert acc["confusion"]["move"] == {"unparsed": 1}


@pytest.mark.parametrize(
    ("caption", "type_right", "object_right"),
    [
        ("the small red metal cube moved", True, True),
        ("the big red metal cube moved", True, False),  # the wrong object, but an object
        ("the small red thing moved", True, False),  # a generic noun names an object without its shape
        ("the small red metal dog moved", False, False),  # nonsense object words
        ("the small red metal moved", False, False),  # no noun
        ("the small small cube moved", False, False),  # an attribute twice
        ("the small red metal cube has disappeared", False, True),
    ],
)
def test_the_type_is_credited_only_with_an_object(caption: str, type_right: bool, object_right: bool) -> None:
    acc = caption_accuracy({"p": caption}, {"p": PairTruth("move", dict(OBJECT))})
    assert acc["change"] == 1.0  # every caption here names a change
    assert acc["type"] == float(type_right) and acc["object"] == float(object_right)


def test_moves_reported_as_an_add_or_a_drop() -> None:
    truths = {f"m{i}": PairTruth("move", dict(OBJECT)) for i in range(4)} | {"d": PairTruth("drop", dict(OBJECT))}
    predictions = {
        "m0": "the small red metal cube moved",
        "m1": "the small red metal cube has disappeared",
        "m2": "a new small red metal cube appeared",
        "m3": "nothing has changed",
        "d": "the small red metal cube is gone",
    }
    acc = caption_accuracy(predictions, truths)
    assert acc["move_as_add_drop"] == pytest.approx(2 / 4)
    assert acc["miss_rate"] == pytest.approx(1 / 5) and acc["false_positive_rate"] is None
    assert acc["confusion"]["move"] == {"add": 1, "drop": 1, "move": 1, NO_CHANGE: 1}
    assert acc["per_type"]["move"]["move_as_add_drop"] == pytest.approx(2 / 4)
    assert acc["per_type"]["drop"]["move_as_add_drop"] is None


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
    assert acc["unparsed"] == 0 and acc["miss_rate"] == 0.0 and acc["false_positive_rate"] == 0.0
    assert acc["move_as_add_drop"] == 0.0
    assert all(set(row) == {kind} for kind, row in acc["confusion"].items())
    changed = [p for p in pairs if p.change_type != NO_CHANGE]
    assert all(truths[p.id].object is not None for p in changed)
    # Without scenes.json only change and type are known.
    (tmp_path / "scenes.json").unlink()
    bare = caption_accuracy(predictions, scene_truths(tmp_path, pairs))
    assert bare["object"] is None and bare["type"] == 1.0
