"""Caption correctness on CLEVR-style benchmarks: does a caption say *what* changed, not just sound right?

CIDEr rewards template captions that name the wrong object (the no-change pairs alone carry much of the
score), so the demo and ``procap evaluate`` also parse every generated caption with the grammar of the
CLEVR-Change templates into fields and compare them with the pair's ground truth:

- ``change``: change detected or not, over all pairs: a change pair needs a caption that names a change, a
  distractor one that says "no change"; a caption the grammar cannot parse is wrong on both;
- ``type``: over the change pairs, the change type (color / material / add / drop / move) named right, credited
  only when the caption's object words describe an object (attribute words, none repeated, ending in a shape or in
  "thing" / "object"): "the small red metal dog moved" and "the small red moved" name no type;
- ``object``: over the change pairs, all four attributes (size, colour, material, shape) of the changed object
  named right (its *before* attributes; the new object's for ``add``);
- ``new_value``: over colour and material changes, the new colour / material named right (a caption that names
  none, like "the ... changed its color", counts as not right);
- ``distinct``: distinct captions over the change pairs divided by their number (1.0: all different).

The failure kinds are kept apart, since one ``change`` figure mixes them:

- ``miss_rate``: over the change pairs, the captions that say "no change";
- ``false_positive_rate``: over the distractor pairs, the captions that name a change;
- ``unparsed_changes`` / ``unparsed_distractors``: how many captions of each kind of pair the grammar could not
  parse (counted wrong above; ``unparsed`` is their sum);
- ``move_as_add_drop``: over the move pairs, the captions that call the change an add or a drop (what a model
  reports when it sees an object vanish in one place and appear in another without relating the two);
- ``confusion``: true type -> {type the caption names, or ``unparsed``: count}.

The parser accepts the synthetic generator's templates and the usual CLEVR-Change synonyms (ball / sphere,
block / cube, shiny / metal, matte / rubber, tiny / small, big / large...). Ground truth comes from the pair's
``change_type`` (every CLEVR-Change loader fills it) and, for the object and the new value, from the
``scenes.json`` that ``procap synth`` writes; without it only ``change`` and ``type`` are reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procap.core.json_files import read_json
from procap.data.render import COLORS, MATERIALS, SHAPES, SIZES

CHANGE_TYPES = ("color", "material", "add", "drop", "move")
NO_CHANGE = "no_change"

# word -> (attribute, canonical value); the canonical values are the generator's.
_ATTRIBUTE_WORDS: dict[str, tuple[str, str]] = {
    **{c: ("color", c) for c in COLORS},
    "grey": ("color", "gray"),
    **{m: ("material", m) for m in MATERIALS},
    "metallic": ("material", "metal"),
    "shiny": ("material", "metal"),
    "matte": ("material", "rubber"),
    **{s: ("shape", s) for s in SHAPES},
    "ball": ("shape", "sphere"),
    "block": ("shape", "cube"),
    **{s: ("size", s) for s in SIZES},
    "tiny": ("size", "small"),
    "little": ("size", "small"),
    "big": ("size", "large"),
}
ATTRIBUTES = ("size", "color", "material", "shape")
# Nouns that name an object without naming its shape ("the small red thing"); they end an object's words.
GENERIC_NOUNS = ("thing", "object")

_OBJ = r"(?P<obj>[a-z ]+?)"
_NEW = r"(?P<new>[a-z]+)"
# (pattern, type); "{t} changed to {new}" is colour or material depending on the word. Order matters: the
# first full match wins, so the more specific phrasings come first.
_PHRASES: tuple[tuple[str, str | None], ...] = (
    (r"no change (?:was made|has occurred|happened)", NO_CHANGE),
    (r"(?:there is|there was) no change", NO_CHANGE),
    (r"nothing (?:has |was )?changed", NO_CHANGE),
    (
        r"the (?:two )?scenes? (?:remains?|is|are|seems?|look) (?:the same|identical|unchanged)(?: as before)?",
        NO_CHANGE,
    ),
    (r"the two scenes seem identical", NO_CHANGE),
    (rf"the colou?r of the {_OBJ} (?:changed|changes) to {_NEW}", "color"),
    (rf"the material of the {_OBJ} (?:changed|changes) to {_NEW}", "material"),
    (rf"the {_OBJ} changed its colou?r", "color"),
    (rf"the {_OBJ} changed its material", "material"),
    (rf"the {_OBJ} (?:was|is|has been) painted {_NEW}", "color"),
    (rf"the {_OBJ} turned {_NEW}", "color"),
    (rf"the {_OBJ} is now made of {_NEW}", "material"),
    (rf"the {_OBJ} (?:changed|changes|became|becomes|is now) (?:to )?{_NEW}", None),
    (rf"the {_OBJ} (?:has been|was) newly placed", "add"),
    (rf"someone (?:has )?added (?:a|an|the) {_OBJ}", "add"),
    (rf"(?:a|an) (?:new )?{_OBJ} (?:has been|was) added", "add"),
    (rf"there is (?:a|an) new {_OBJ}", "add"),
    (rf"(?:a|an) new {_OBJ} (?:appeared|has appeared)", "add"),
    (rf"the {_OBJ} (?:has disappeared|disappeared|is missing|is gone|was removed|has been removed)", "drop"),
    (rf"there is no longer (?:a|an|the) {_OBJ}", "drop"),
    (rf"someone (?:has )?removed (?:a|an|the) {_OBJ}", "drop"),
    (rf"someone (?:has )?changed the location of the {_OBJ}", "move"),
    (rf"the {_OBJ} (?:changed its location|is in a different location|was moved|has been moved|moved)", "move"),
)
_COMPILED = tuple((re.compile(rf"^{pattern}$"), kind) for pattern, kind in _PHRASES)


UNPARSED = "unparsed"  # the confusion matrix's column for captions the grammar does not parse
# The failure kinds as the demo's tables name them: (key of caption_accuracy, column title, a fraction or a count).
FAILURE_COLUMNS = (
    ("miss_rate", "miss", "fraction"),
    ("false_positive_rate", "false pos.", "fraction"),
    # the same image as before and after captioned with a change (procap.eval.split.identical_pair_rate; the demo)
    ("identical_change_rate", "same image", "fraction"),
    ("unparsed_changes", "unparsed", "count"),
    ("move_as_add_drop", "move as add/drop", "fraction"),
)


@dataclass(frozen=True)
class ParsedCaption:
    """What a caption says. ``type`` is None when no phrase of the grammar matches."""

    type: str | None
    object: dict[str, str] | None = None  # attribute -> canonical value, only the attributes named
    new_value: str | None = None
    noun: bool = False  # the object words end in a noun: a shape or a generic one ("thing")

    @property
    def claims_change(self) -> bool:
        """The caption names a change (a parsed phrase other than "no change")."""
        return self.type is not None and self.type != NO_CHANGE

    @property
    def claims_no_change(self) -> bool:
        return self.type == NO_CHANGE

    @property
    def names_object(self) -> bool:
        """The object words describe an object: attribute words only, none repeated, ending in a noun."""
        return self.object is not None and self.noun

    def detects(self, truth: PairTruth) -> bool:
        """Right about whether anything changed: an unparsed caption is right about nothing."""
        return self.claims_change if truth.is_change else self.claims_no_change

    def names_type_of(self, truth: PairTruth) -> bool:
        """Right about the change type, with an object to go with it."""
        return self.type == truth.type and self.names_object


@dataclass(frozen=True)
class PairTruth:
    """Ground truth of one pair: its type, and (when known) the changed object and the new value."""

    type: str
    object: dict[str, str] | None = None
    new_value: str | None = None

    @property
    def is_change(self) -> bool:
        return self.type != NO_CHANGE


def _normalise(text: str) -> str:
    words = re.sub(r"[^a-z ]+", " ", text.lower()).split()
    return " ".join(words)


def _attributes(span: str) -> dict[str, str] | None:
    """'small red metal cube' -> {size, color, material, shape}, 'small red thing' -> {size, color}; None if a word
    is neither an attribute nor a final generic noun, or an attribute repeats, or nothing is named."""
    words = span.split()
    if words and words[-1] in GENERIC_NOUNS:
        words = words[:-1]
    found: dict[str, str] = {}
    for word in words:
        if word not in _ATTRIBUTE_WORDS:
            return None
        attribute, value = _ATTRIBUTE_WORDS[word]
        if attribute in found:
            return None
        found[attribute] = value
    return found or None


def _ends_in_noun(span: str) -> bool:
    last = span.split()[-1] if span.split() else ""
    return last in GENERIC_NOUNS or _ATTRIBUTE_WORDS.get(last, ("", ""))[0] == "shape"


def parse_caption(text: str) -> ParsedCaption:
    """Parse one caption with the CLEVR-Change template grammar (see the module docstring)."""
    sentence = _normalise(text)
    for pattern, kind in _COMPILED:
        match = pattern.match(sentence)
        if match is None:
            continue
        groups = match.groupdict()
        obj = _attributes(groups["obj"]) if groups.get("obj") else None
        noun = obj is not None and _ends_in_noun(groups["obj"])
        new = _ATTRIBUTE_WORDS.get(groups.get("new") or "")
        if kind is None:  # "changed to X": colour or material by the word
            if new is None or new[0] not in ("color", "material"):
                continue
            kind = new[0]
        new_value = new[1] if new is not None and new[0] == kind else None
        return ParsedCaption(kind, obj, new_value, noun)
    return ParsedCaption(None)


def scene_truths(root: str | Path, pairs: Iterable[Any]) -> dict[str, PairTruth]:
    """Ground truth per pair id from the pairs' ``change_type`` and, when present, ``<root>/scenes.json``."""
    scenes: dict[int, dict[str, Any]] = {}
    path = Path(root) / "scenes.json"
    if path.is_file():
        data = read_json(path, "synthetic scenes file")
        scenes = {int(s["index"]): s for s in data.get("scenes", []) if isinstance(s, dict) and "index" in s}
    truths = {}
    for pair in pairs:
        if pair.change_type is None:
            continue
        truths[pair.id] = _truth(pair, scenes)
    return truths


def _truth(pair: Any, scenes: Mapping[int, dict[str, Any]]) -> PairTruth:
    if pair.change_type == NO_CHANGE:
        return PairTruth(NO_CHANGE)
    index = int(Path(str(pair.id)).stem.split("_")[-1])
    scene = scenes.get(index)
    if scene is None:
        return PairTruth(pair.change_type)
    change = scene["change"]
    obj = change["object"] if change["type"] == "add" else scene["objects"][change["target"]]
    new = change.get("to") if change["type"] in ("color", "material") else None
    return PairTruth(change["type"], {a: obj[a] for a in ATTRIBUTES}, new)


def _fraction(hits: int, total: int) -> float | None:
    return hits / total if total else None


def caption_accuracy(predictions: Mapping[str, str], truths: Mapping[str, PairTruth]) -> dict[str, Any]:
    """Correctness of ``predictions`` (pair id -> caption) against ``truths``: overall and per change type.

    Returns:
        ``{"change", "miss_rate", "false_positive_rate", "type", "object", "attributes": {size, color, material,
        shape}, "new_value", "move_as_add_drop", "distinct", "pairs", "change_pairs", "distractor_pairs",
        "unparsed", "unparsed_changes", "unparsed_distractors", "confusion", "per_type": {type: {...}}}``
        (see the module docstring); fractions in [0, 1], None where nothing was there to count (e.g. the object
        without a ``scenes.json``, the false-positive rate without distractor pairs).
    """
    ids = [i for i in predictions if i in truths]
    overall = _accuracy_over(ids, predictions, truths)
    per_type = {}
    for kind in (*CHANGE_TYPES, NO_CHANGE):
        members = [i for i in ids if truths[i].type == kind]
        if members:
            per_type[kind] = _accuracy_over(members, predictions, truths)
    return {**overall, "per_type": per_type}


def _accuracy_over(ids: list[str], predictions: Mapping[str, str], truths: Mapping[str, PairTruth]) -> dict:
    parsed = {i: parse_caption(predictions[i]) for i in ids}
    changes = [i for i in ids if truths[i].is_change]
    distractors = [i for i in ids if not truths[i].is_change]
    moves = [i for i in changes if truths[i].type == "move"]
    # (the object a caption names, the changed object) of every change pair whose changed object is known
    objects = [(parsed[i].object, truth) for i in changes if (truth := truths[i].object) is not None]
    with_value = [i for i in changes if truths[i].new_value is not None]
    confusion: dict[str, dict[str, int]] = {}
    for i in ids:
        row = confusion.setdefault(truths[i].type, {})
        named = parsed[i].type or UNPARSED
        row[named] = row.get(named, 0) + 1
    unparsed_changes = sum(parsed[i].type is None for i in changes)
    unparsed_distractors = sum(parsed[i].type is None for i in distractors)
    return {
        "change": _fraction(sum(parsed[i].detects(truths[i]) for i in ids), len(ids)),
        "miss_rate": _fraction(sum(parsed[i].claims_no_change for i in changes), len(changes)),
        "false_positive_rate": _fraction(sum(parsed[i].claims_change for i in distractors), len(distractors)),
        "type": _fraction(sum(parsed[i].names_type_of(truths[i]) for i in changes), len(changes)),
        "object": _fraction(sum(named == truth for named, truth in objects), len(objects)),
        # Each attribute of the changed object on its own: shows which one a model misses when "object" is low.
        "attributes": {
            a: _fraction(sum((named or {}).get(a) == truth[a] for named, truth in objects), len(objects))
            for a in ATTRIBUTES
        },
        "new_value": _fraction(sum(parsed[i].new_value == truths[i].new_value for i in with_value), len(with_value)),
        "move_as_add_drop": _fraction(sum(parsed[i].type in ("add", "drop") for i in moves), len(moves)),
        "distinct": _fraction(len({predictions[i] for i in changes}), len(changes)),
        "pairs": len(ids),
        "change_pairs": len(changes),
        "distractor_pairs": len(distractors),
        "unparsed": unparsed_changes + unparsed_distractors,
        "unparsed_changes": unparsed_changes,
        "unparsed_distractors": unparsed_distractors,
        "confusion": {kind: dict(sorted(row.items())) for kind, row in sorted(confusion.items())},
    }
