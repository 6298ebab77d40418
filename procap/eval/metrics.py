"""Caption metrics: BLEU-1..4, METEOR, ROUGE-L, CIDEr-D and SPICE through pycocoevalcap, with CLEVR-Change
breakdowns.

The PTB tokenizer, METEOR and SPICE of pycocoevalcap run Java. Without Java, tokenization falls back to
``procap.data.tokenize`` (same lower-casing and punctuation stripping), the default metric set leaves METEOR and
SPICE out with a one-line note (:func:`available_metrics`), and asking for either raises one sentence naming the fix.
SPICE also needs the Stanford CoreNLP 3.6.0 jars in pycocoevalcap's ``spice/lib`` (pycocoevalcap fetches them on its
first SPICE run; procap never downloads them itself, so a machine without them skips SPICE the same way).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from procap.core.errors import ProCapError
from procap.core.extras import require
from procap.core.files import atomic_write_json
from procap.core.json_files import read_json
from procap.data.vocab import tokenize

# The one metric-name table: display name -> (pycocoevalcap scorer, its result key). Any common spelling of a name
# (BLEU-4, bleu, Bleu_4, BLEU-1, ROUGE-L, rouge_l, CIDEr, CIDEr-D, cider, METEOR, SPICE, ...) resolves through
# metric_name(); metric_names() reads a whole list (commas or spaces between names) for every command and the
# library. The LEVIR-CC tables report all four BLEU orders; the CLEVR-Change tables add SPICE.
METRIC_TABLE: dict[str, tuple[str, str]] = {
    "BLEU-1": ("bleu", "Bleu_1"),
    "BLEU-2": ("bleu", "Bleu_2"),
    "BLEU-3": ("bleu", "Bleu_3"),
    "BLEU-4": ("bleu", "Bleu_4"),
    "METEOR": ("meteor", "METEOR"),
    "ROUGE-L": ("rouge", "ROUGE_L"),
    "CIDEr": ("cider", "CIDEr"),
    "SPICE": ("spice", "SPICE"),
}
METRICS = tuple(METRIC_TABLE)
NEEDS_JAVA = ("METEOR", "SPICE")
# A bare "bleu" stays BLEU-4, the one every paper quotes when it names a single BLEU.
_SPELLINGS = {"bleu": "BLEU-4", "meteor": "METEOR", "rouge": "ROUGE-L", "rougel": "ROUGE-L", "spice": "SPICE"}
_SPELLINGS |= {f"bleu{n}": f"BLEU-{n}" for n in range(1, 5)}
_SPELLINGS |= {"cider": "CIDEr", "ciderd": "CIDEr"}
# A word that only ends a name ("BLEU 4", "ROUGE L", "CIDEr D"): joined to the word before it, not a name of its own.
_NAME_ENDINGS = ("1", "2", "3", "4", "l", "d")
# What every --metrics help says about the spellings metric_names() reads.
METRICS_SPELLING_HELP = (
    "names separated by commas or spaces, in any case: BLEU (= BLEU-4), BLEU-1..BLEU-4, METEOR, ROUGE-L (or rouge), "
    "CIDEr (or CIDEr-D), SPICE; e.g. 'BLEU-4 CIDEr' or bleu,cider"
)
# The scale of every score a command prints or writes: x100, as the papers print them, under the table's names.
SCORE_SCALE = 100.0


def metric_name(name: str) -> str:
    """The :data:`METRIC_TABLE` name of any common spelling of one metric (case, ``-``, ``_`` and spaces ignored).

    Raises:
        ProCapError: the name is none of the table's in any spelling.
    """
    key = "".join(ch for ch in str(name).lower() if ch not in "-_ ")
    if key not in _SPELLINGS:
        raise ProCapError(f"unknown metric {name!r}; choose from: {', '.join(METRIC_TABLE)}.")
    return _SPELLINGS[key]


def metric_names(names: str | Iterable[str]) -> list[str]:
    """The :data:`METRIC_TABLE` names of a list of metrics in any spelling, duplicates dropped, order kept.

    The one reading of metric names: ``procap evaluate --metrics``, ``procap score --metrics``, ``--val-metrics`` and
    the library all call it. ``names`` is one string or several; each may hold several names separated by commas or
    white space (``"bleu,cider"``, ``"BLEU-4 CIDEr"``, ``["BLEU-4", "rouge,cider"]``), and a name may itself contain
    a space before its order or variant (``"BLEU 4"``, ``"ROUGE L"``).

    Raises:
        ProCapError: a name is none of the table's in any spelling.
    """
    words: list[str] = []
    for item in [names] if isinstance(names, str) else names:
        for word in re.split(r"[,\s]+", str(item)):
            if not word:
                continue
            if words and word.lower().strip("-_") in _NAME_ENDINGS:
                words[-1] += word  # "BLEU 4": one name written with a space
            else:
                words.append(word)
    return list(dict.fromkeys(metric_name(word) for word in words))


def paper_scale(results: dict[str, Any]) -> dict[str, Any]:
    """:func:`score`'s raw result (pycocoevalcap's keys, fractions) as the commands show it: the table's names and
    x :data:`SCORE_SCALE`, in the table's order; ``by_type`` groups likewise (their ``count`` kept), any other
    entry unchanged.
    """
    shown: dict[str, Any] = {
        name: SCORE_SCALE * float(results[key]) for name, (_, key) in METRIC_TABLE.items() if key in results
    }
    raw_keys = {key for _, key in METRIC_TABLE.values()}
    for key, value in results.items():
        if key == "by_type":
            shown[key] = {group: paper_scale(values) for group, values in value.items()}
        elif key not in raw_keys:
            shown[key] = value
    return shown


def java_available() -> bool:
    return shutil.which("java") is not None


def _spice_folder() -> Path | None:
    """pycocoevalcap's ``spice`` folder (the jar and its ``lib``), None without pycocoevalcap."""
    try:
        from pycocoevalcap import spice
    except ImportError:
        return None
    return Path(spice.__file__).parent


def spice_missing() -> str | None:
    """Why SPICE cannot run here, in a few words; None when it can."""
    if not java_available():
        return "it needs Java (install a JRE, e.g. `apt-get install default-jre-headless`)"
    folder = _spice_folder()
    if folder is None:
        return "it needs pycocoevalcap, from the [eval] extra"
    corenlp = folder / "lib" / "stanford-corenlp-3.6.0.jar"
    if not (folder / "spice-1.0.jar").is_file() or not corenlp.is_file():
        return f"it needs Stanford CoreNLP 3.6.0 in {corenlp.parent} (pycocoevalcap's Spice() fetches it once, online)"
    return None


def unavailable_metrics(names: Iterable[str]) -> dict[str, str]:
    """Each metric of ``names`` this machine cannot compute, with why in a few words."""
    names = metric_names(names)
    reasons = {}
    if "METEOR" in names and not java_available():
        reasons["METEOR"] = "it needs Java (install a JRE, e.g. `apt-get install default-jre-headless`)"
    if "SPICE" in names and (why := spice_missing()):
        reasons["SPICE"] = why
    return reasons


def available_metrics(wanted: Iterable[str] = METRICS) -> tuple[tuple[str, ...], str | None]:
    """The metrics of ``wanted`` this machine can compute, and a one-line note naming those left out and why
    (METEOR without Java; SPICE without Java or its CoreNLP jars); the note is None when none is left out."""
    names = metric_names(wanted)
    reasons = unavailable_metrics(names)
    if not reasons:
        return tuple(names), None
    if len(set(reasons.values())) == 1:
        note = f"{' and '.join(reasons)} skipped: {next(iter(reasons.values()))}"
    else:
        note = "; ".join(f"{name} skipped: {why}" for name, why in reasons.items())
    return tuple(n for n in names if n not in reasons), note


def require_java(metrics: Iterable[str], leave_out: str = "with --metrics bleu,rouge,cider") -> None:
    """Raise one sentence when ``metrics`` ask for METEOR and no Java runtime is installed (checked before the
    captions are made: a training run learnt it only at its first validation).

    Args:
        metrics: any spellings of the metric names.
        leave_out: how the message says to leave METEOR out, e.g. ``"of val_metrics"``.
    """
    if "METEOR" in metric_names(metrics) and not java_available():
        raise ProCapError(
            "METEOR needs a Java runtime: install one (e.g. apt-get install default-jre-headless) "
            f"or leave METEOR out {leave_out}."
        )


def reference_list(key: str, value: Any, source: str = "references") -> list[str]:
    """The one rule for an id's references, whether they come from Python, a file or a dataset split.

    A single string is one reference (iterating it would score it character by character); otherwise a list of
    strings, at least one of them not blank (against only blank references a caption is scored against nothing).

    Raises:
        ProCapError: naming ``source`` and the id.
    """
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, (list, tuple)) or not all(isinstance(c, str) for c in value):
        raise ProCapError(f"{source} has a non-caption value for id {key!r} (give a list of caption strings).")
    if not any(c.strip() for c in value):
        raise ProCapError(f"{source} has no reference caption for id {key!r} (its list is empty or all blank).")
    return list(value)


def _check_inputs(predictions: dict[str, str], references: dict[str, Any]) -> dict[str, list[str]]:
    """The predicted ids' references under :func:`reference_list`'s rule; every caption a string."""
    missing = [key for key in predictions if key not in references]
    if missing:
        raise ProCapError(f"{len(missing)} predicted id(s) have no references, e.g. {missing[0]!r}.")
    for key, caption in predictions.items():
        if not isinstance(caption, str):
            raise ProCapError(f"the prediction of id {key!r} is {type(caption).__name__}, not a string.")
    return {key: reference_list(key, references[key]) for key in predictions}


# pycocoevalcap's PTBTokenizer drops these tokens after tokenising.
_PTB_PUNCTUATION = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)
# An empty line must still come back as one line; a lone period does and tokenises to nothing.
_EMPTY_PLACEHOLDER = "."


def normalize_caption(text: str) -> str:
    """One line of single-spaced text.

    The Stanford tokenizer reads one caption per line and treats \\r, \\v, \\f, U+0085, U+2028 and U+2029 as line
    breaks too, so a caption holding one would shift every later caption onto the wrong references. Every run of
    whitespace (all of those included) becomes one space; characters UTF-8 cannot encode (lone surrogates from
    JSON escapes) become ``?``.
    """
    text = text.encode("utf-8", "replace").decode("utf-8")
    return " ".join(text.split())


def _ptb_tokenize(sentences: list[str]) -> list[str]:
    """The Stanford PTB tokenizer of pycocoevalcap, one output line per input caption, checked.

    Runs the same jar and options as ``pycocoevalcap.tokenizer.ptbtokenizer`` (so scores match published ones),
    with the input in a private temporary folder rather than inside site-packages.
    """
    from pycocoevalcap.tokenizer import ptbtokenizer

    jar = Path(ptbtokenizer.__file__).with_name(ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR)
    lines = [normalize_caption(s) or _EMPTY_PLACEHOLDER for s in sentences]
    with tempfile.TemporaryDirectory(prefix="procap-ptb-") as tmp:
        source = Path(tmp) / "captions.txt"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        command = [
            "java",
            "-cp",
            str(jar),
            "edu.stanford.nlp.process.PTBTokenizer",
            "-preserveLines",
            "-lowerCase",
            "-encoding",
            "utf-8",
            str(source),
        ]
        done = subprocess.run(command, capture_output=True, check=False)
    if done.returncode != 0:
        raise OSError(f"java exited with code {done.returncode}: {done.stderr.decode(errors='replace')[-200:]}")
    output = done.stdout.decode("utf-8", "replace").split("\n")
    if output and output[-1] == "":
        output.pop()
    if len(output) != len(lines):
        raise ProCapError(
            f"the PTB tokenizer returned {len(output)} lines for {len(lines)} captions, so captions "
            "would be scored against the wrong references; please report this caption set."
        )
    return [" ".join(w for w in line.rstrip().split(" ") if w and w not in _PTB_PUNCTUATION) for line in output]


def _tokenize(texts: dict[str, list[str]]) -> dict[str, list[str]]:
    """Stanford PTB tokenisation (one Java call); procap's own tokenizer when Java is missing or fails."""
    if java_available():
        keys = [k for k, v in texts.items() for _ in v]
        try:
            tokens = _ptb_tokenize([c for v in texts.values() for c in v])
        except OSError as exc:
            warnings.warn(f"Stanford PTBTokenizer failed ({exc}); using procap's tokenizer", stacklevel=2)
        else:
            out: dict[str, list[str]] = {k: [] for k in texts}
            for key, line in zip(keys, tokens):
                out[key].append(line)
            return out
    return {k: [" ".join(tokenize(normalize_caption(c))) for c in v] for k, v in texts.items()}


class _Spice:
    """SPICE as pycocoevalcap's ``Spice`` computes it (the same jar, options and averaging), with its input and output
    in a private temporary folder rather than inside site-packages, and no download: :func:`spice_missing` is
    checked first."""

    def compute_score(self, gts: dict[str, list[str]], res: dict[str, list[str]]) -> tuple[float, list[float]]:
        folder = _spice_folder()
        keys = sorted(gts)
        entries = [{"image_id": key, "test": res[key][0], "refs": gts[key]} for key in keys]
        with tempfile.TemporaryDirectory(prefix="procap-spice-") as tmp:
            source, result = Path(tmp) / "input.json", Path(tmp) / "output.json"
            source.write_text(json.dumps(entries), encoding="utf-8")
            command = [
                "java",
                "-jar",
                "-Xmx8G",
                "spice-1.0.jar",
                str(source),
                "-out",
                str(result),
                "-subset",
                "-silent",
            ]
            done = subprocess.run(command, cwd=folder, capture_output=True, check=False)
            if done.returncode != 0:
                tail = done.stderr.decode(errors="replace")[-200:]
                raise ProCapError(f"SPICE (java) exited with code {done.returncode}: {tail}")
            spice_rows = read_json(result, "SPICE output")
            scores = {str(item["image_id"]): item["scores"]["All"]["f"] for item in spice_rows}
        values = [_as_float(scores.get(key)) for key in keys]
        finite = [v for v in values if not math.isnan(v)]
        return (sum(finite) / len(finite) if finite else math.nan), values


def _as_float(value: Any) -> float:
    """SPICE writes ``NaN`` (or null) for a caption without a scene graph; such a caption counts as not scored."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _scorers(metrics: Iterable[str]) -> list[tuple[str, Any]]:
    require("pycocoevalcap", "caption metrics")  # the [eval] extra: one sentence when it is missing
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    scorers = []
    # BLEU-1..4 come from one scorer: each scorer once, in the table's order of first use.
    for metric in dict.fromkeys(METRIC_TABLE[name][0] for name in metric_names(metrics)):
        if metric == "bleu":
            scorers.append((metric, Bleu(4)))
        elif metric == "rouge":
            scorers.append((metric, Rouge()))
        elif metric == "cider":
            scorers.append((metric, Cider()))
        elif metric == "meteor":
            require_java(["METEOR"])
            from pycocoevalcap.meteor.meteor import Meteor

            scorers.append((metric, Meteor()))
        elif metric == "spice":
            why = spice_missing()
            if why:
                raise ProCapError(f"SPICE cannot run here: {why}; leave SPICE out of --metrics.")
            scorers.append((metric, _Spice()))
    return scorers


_RESULT_KEYS = {"meteor": "METEOR", "rouge": "ROUGE_L", "cider": "CIDEr", "spice": "SPICE"}  # one-number scorers


def _score_tokenized(
    gts: dict[str, list[str]], res: dict[str, list[str]], scorers: list[tuple[str, Any]]
) -> dict[str, float]:
    results: dict[str, float] = {}
    for metric, scorer in scorers:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap prints its internals
            value, _ = scorer.compute_score(gts, res)
        if metric == "bleu":
            for n, bleu_n in enumerate(value, start=1):
                results[f"Bleu_{n}"] = float(bleu_n)
        else:
            results[_RESULT_KEYS[metric]] = float(value)
    return results


def score(
    predictions: dict[str, str],
    references: dict[str, list[str]],
    metrics: Iterable[str] | None = None,
    change_types: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """Score predicted captions against references.

    Args:
        predictions: id -> predicted caption.
        references: id -> reference captions (ids not in ``predictions`` are ignored); :func:`reference_list`
            says what is accepted.
        metrics: any spellings of the :data:`METRIC_TABLE` names (:func:`metric_name`); by default all that this
            machine can compute (:func:`available_metrics`).
        change_types: id -> change type (CLEVR-Change; ``"no_change"`` for distractors), or ``"change"`` /
            ``"no_change"`` alone (LEVIR-CC's ``changeflag``). When given, the result also holds ``"by_type"``: one
            score dict per type and for ``change`` / ``no_change`` / ``total``.

    Returns:
        ``{"Bleu_1".."Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE"}`` (BLEU's four orders whenever one is asked
        for, the others as asked), plus ``"by_type"``.
    """
    if not predictions:
        raise ProCapError("there are no predictions to score.")
    if isinstance(metrics, str):  # one name, not its letters
        metrics = [metrics]
    names = metric_names(metrics) if metrics is not None else list(available_metrics()[0])
    if not names:  # an empty list scored nothing and returned {}: a result with no numbers in it
        raise ProCapError(f"metrics names no metric; give at least one of {', '.join(METRICS)}, or None for all.")
    references = _check_inputs(predictions, references)
    scorers = _scorers(names)
    # The tokenizer ignores empty hypotheses badly; a lone space keeps the id present.
    # One tokenizer run for hypotheses and references (each Java start costs about a second).
    both = _tokenize(
        {
            **{f"h{k}": [v if v.strip() else " "] for k, v in predictions.items()},
            **{f"r{k}": list(references[k]) for k in predictions},
        }
    )
    res = {k: both[f"h{k}"] for k in predictions}
    gts = {k: both[f"r{k}"] for k in predictions}
    results: dict[str, Any] = _score_tokenized(gts, res, scorers)
    if change_types is not None:
        check_type_names(change_types, predictions)
        groups: dict[str, list[str]] = {"total": list(predictions)}
        for key in predictions:
            kind = change_types.get(key)
            if kind is None:
                continue
            if kind not in ("change", "no_change"):  # a named type (CLEVR-Change); LEVIR-CC has only the two groups
                groups.setdefault(kind, []).append(key)
            groups.setdefault("no_change" if kind == "no_change" else "change", []).append(key)
        results["by_type"] = {
            name: {
                **_score_tokenized({k: gts[k] for k in keys}, {k: res[k] for k in keys}, scorers),
                "count": len(keys),
            }
            for name, keys in sorted(groups.items())
        }
    return results


# The breakdown's group of every pair. A change type of this name would be counted in it twice. ("change" and
# "no_change" are the two groups LEVIR-CC's changeflag gives; the breakdown takes them as those groups, once.)
RESERVED_TYPE_NAMES = ("total",)


def check_type_names(change_types: dict[str, str | None], predictions: dict[str, str]) -> None:
    """Refuse a change type that is no string or names the ``total`` group (its ids counted twice in the total,
    and its own group's score replacing the total's)."""
    for key in predictions:
        kind = change_types.get(key)
        if kind is not None and not isinstance(kind, str):
            raise ProCapError(f"the change type of id {key!r} is {type(kind).__name__}, not a string.")
        if kind in RESERVED_TYPE_NAMES:
            raise ProCapError(
                f"id {key!r} has the change type {kind!r}, which is the name of the breakdown's group of every pair; "
                "rename the type."
            )


# The files of an evaluation folder (procap.eval.split.write_evaluation), in the order they are moved into place; here,
# torch-free, so that `procap evaluate` refuses a folder holding them before it loads anything.
EVALUATION_FILES = ("results.json", "references.json", "metrics.json")


def write_results(path: str | os.PathLike, predictions: dict[str, str]) -> None:
    """COCO-style result file: ``[{"image_id": id, "caption": text}, ...]``, written atomically."""
    atomic_write_json(path, [{"image_id": k, "caption": v} for k, v in predictions.items()])


def read_predictions(path: str | os.PathLike) -> dict[str, str]:
    """A COCO-style result list ``[{"image_id", "caption"}, ...]`` or an ``{id: caption}`` object.

    Raises:
        ProCapError: naming the file, when it is not one of those shapes, an id is not a string or integer, a
            caption is not a string, or an id appears twice (only one of its captions could be scored).
    """
    data = read_json(path, "prediction file")
    shape = f"prediction file {path} must be a COCO result list of {{image_id, caption}} or an {{id: caption}} object"
    if isinstance(data, dict):
        entries = list(data.items())
    elif isinstance(data, list) and all(isinstance(d, dict) and {"image_id", "caption"} <= set(d) for d in data):
        entries = [(d["image_id"], d["caption"]) for d in data]
    else:
        raise ProCapError(f"{shape}.")
    predictions: dict[str, str] = {}
    for key, caption in entries:
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise ProCapError(f"{shape}; it holds the id {key!r}, which is neither a string nor an integer.")
        if not isinstance(caption, str):
            raise ProCapError(f"{shape}; the caption of id {key!r} is {type(caption).__name__}, not a string.")
        if str(key) in predictions:
            raise ProCapError(f"prediction file {path} has two captions for id {key!r}.")
        predictions[str(key)] = caption
    return predictions


def read_references(path: str | os.PathLike) -> dict[str, list[str]]:
    """An ``{id: [caption, ...]}`` object, as ``procap evaluate`` writes to ``references.json`` (each id's
    references under :func:`reference_list`'s rule; an id twice is refused by :func:`read_json`)."""
    data = read_json(path, "reference file")
    if not isinstance(data, dict):
        raise ProCapError(f"reference file {path} must be an object from id to a list of captions.")
    return {str(key): reference_list(key, value, f"reference file {path}") for key, value in data.items()}


def format_table(results: dict[str, Any]) -> str:
    """A small text table of the scores of :func:`paper_scale` (x100, the table's names): the ``total`` row of all
    pairs, then one per group of the breakdown when present (whose own ``total`` is that row, shown once)."""
    columns = [name for name in METRIC_TABLE if name in results]
    groups = [(name, values) for name, values in results.get("by_type", {}).items() if name != "total"]
    rows = [("total", results), *groups]
    lines = [f"{'':<12}" + "".join(f"{c:>10}" for c in columns)]
    for name, values in rows:
        lines.append(f"{name:<12}" + "".join(f"{values[c]:>10.1f}" for c in columns))
    return "\n".join(lines)
