"""Caption metrics: BLEU-4, METEOR, ROUGE-L, CIDEr-D through pycocoevalcap, with CLEVR-Change breakdowns.

The PTB tokenizer and METEOR of pycocoevalcap run Java. Without Java, tokenization falls back to
``procap.data.tokenize`` (same lower-casing and punctuation stripping) and asking for METEOR raises one
sentence naming the fix.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import warnings
from collections.abc import Iterable
from typing import Any

from procap.data.records import read_json
from procap.data.vocab import tokenize
from procap.errors import ProCapError
from procap.files import atomic_write_json

# The one metric-name table: display name -> (pycocoevalcap scorer, its result key). Any common spelling of a name
# (BLEU-4, bleu, Bleu_4, ROUGE-L, rouge_l, CIDEr, CIDEr-D, cider, METEOR, ...) resolves through metric_name().
METRIC_TABLE: dict[str, tuple[str, str]] = {
    "BLEU-4": ("bleu", "Bleu_4"),
    "METEOR": ("meteor", "METEOR"),
    "ROUGE-L": ("rouge", "ROUGE_L"),
    "CIDEr": ("cider", "CIDEr"),
}
METRICS = tuple(METRIC_TABLE)
_SPELLINGS = {"bleu": "BLEU-4", "bleu4": "BLEU-4", "meteor": "METEOR", "rouge": "ROUGE-L", "rougel": "ROUGE-L"}
_SPELLINGS |= {"cider": "CIDEr", "ciderd": "CIDEr"}


def metric_name(name: str) -> str:
    """The :data:`METRIC_TABLE` name of any common spelling (case, ``-``, ``_`` and spaces ignored).

    Raises:
        ProCapError: the name is not one of BLEU-4, METEOR, ROUGE-L, CIDEr in any spelling.
    """
    key = "".join(ch for ch in str(name).lower() if ch not in "-_ ")
    if key not in _SPELLINGS:
        raise ProCapError(f"unknown metric {name!r}; choose from: {', '.join(METRIC_TABLE)}.")
    return _SPELLINGS[key]


_RESULT_KEYS = dict(METRIC_TABLE.values())  # scorer -> result key


def metric_names(names: Iterable[str]) -> list[str]:
    """:func:`metric_name` of each, duplicates dropped, order kept."""
    return list(dict.fromkeys(metric_name(n) for n in names))


def java_available() -> bool:
    return shutil.which("java") is not None


def _check_inputs(predictions: dict[str, str], references: dict[str, list[str]]) -> None:
    missing = [key for key in predictions if key not in references]
    if missing:
        raise ProCapError(f"{len(missing)} predicted id(s) have no references, e.g. {missing[0]!r}.")
    empty = [key for key in predictions if not references[key]]
    if empty:
        raise ProCapError(f"id {empty[0]!r} has an empty reference list.")


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the Java tokenizer's 'PTBTokenizer tokenized N tokens' line (written to fd 2 by the child)."""
    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _tokenize(texts: dict[str, list[str]]) -> dict[str, list[str]]:
    """Stanford PTB tokenisation (one Java call); procap's own tokenizer when Java is missing or fails."""
    if java_available():
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

        try:
            with _quiet_stderr():
                return PTBTokenizer().tokenize({k: [{"caption": c} for c in v] for k, v in texts.items()})
        except OSError as exc:  # e.g. read-only site-packages: the tokenizer writes its temporary file there
            warnings.warn(f"Stanford PTBTokenizer failed ({exc}); using procap's tokenizer", stacklevel=2)
    return {k: [" ".join(tokenize(c)) for c in v] for k, v in texts.items()}


def _scorers(metrics: Iterable[str]) -> list[tuple[str, Any]]:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    scorers = []
    for metric in (METRIC_TABLE[name][0] for name in metric_names(metrics)):
        if metric == "bleu":
            scorers.append((metric, Bleu(4)))
        elif metric == "rouge":
            scorers.append((metric, Rouge()))
        elif metric == "cider":
            scorers.append((metric, Cider()))
        elif metric == "meteor":
            if not java_available():
                raise ProCapError(
                    "METEOR needs a Java runtime: install one (e.g. apt-get install default-jre-headless) "
                    "or leave METEOR out with --metrics bleu,rouge,cider."
                )
            from pycocoevalcap.meteor.meteor import Meteor

            scorers.append((metric, Meteor()))
    return scorers


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
        references: id -> reference captions (ids not in ``predictions`` are ignored).
        metrics: any spellings of BLEU-4, METEOR, ROUGE-L, CIDEr (:func:`metric_name`); all by default.
        change_types: id -> change type (CLEVR-Change; ``"no_change"`` for distractors). When given, the result
            also holds ``"by_type"``: one score dict per type and for ``change`` / ``no_change`` / ``total``.

    Returns:
        ``{"Bleu_1".."Bleu_4", "METEOR", "ROUGE_L", "CIDEr"}`` (those asked for), plus ``"by_type"``.
    """
    if not predictions:
        raise ProCapError("there are no predictions to score.")
    _check_inputs(predictions, references)
    scorers = _scorers(metrics if metrics is not None else METRICS)
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
        groups: dict[str, list[str]] = {"total": list(predictions)}
        for key in predictions:
            kind = change_types.get(key)
            if kind is None:
                continue
            if kind != "no_change":
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


def write_results(path: str | os.PathLike, predictions: dict[str, str]) -> None:
    """COCO-style result file: ``[{"image_id": id, "caption": text}, ...]``, written atomically."""
    atomic_write_json(path, [{"image_id": k, "caption": v} for k, v in predictions.items()])


def read_predictions(path: str | os.PathLike) -> dict[str, str]:
    """A COCO-style result list or an ``{id: caption}`` object."""
    data = read_json(path, "prediction file")
    if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
        return {str(k): v for k, v in data.items()}
    if isinstance(data, list) and all(isinstance(d, dict) and {"image_id", "caption"} <= set(d) for d in data):
        return {str(d["image_id"]): str(d["caption"]) for d in data}
    raise ProCapError(
        f"prediction file {path} must be a COCO result list of {{image_id, caption}} or an {{id: caption}} object."
    )


def read_references(path: str | os.PathLike) -> dict[str, list[str]]:
    """An ``{id: [caption, ...]}`` object (a single string is taken as one reference)."""
    data = read_json(path, "reference file")
    if not isinstance(data, dict):
        raise ProCapError(f"reference file {path} must be an object from id to a list of captions.")
    refs = {}
    for key, value in data.items():
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise ProCapError(f"reference file {path} has a non-caption value for id {key!r}.")
        refs[str(key)] = value
    return refs


def format_table(results: dict[str, Any]) -> str:
    """A small text table of the main metrics (and the per-type rows when present)."""
    columns = [c for c in ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr") if c in results]
    rows = [("all", results)] + list(results.get("by_type", {}).items())
    lines = [f"{'':<12}" + "".join(f"{c:>10}" for c in columns)]
    for name, values in rows:
        lines.append(f"{name:<12}" + "".join(f"{100 * values[c]:>10.1f}" for c in columns))
    return "\n".join(lines)
