"""Paired comparisons of two models captioning the same test pairs, with bootstrap intervals over the pairs.

Two models evaluated on one test split differ by a few pairs; whether that gap is more than noise depends on how
many pairs decided it. :func:`paired_difference` scores each pair for both models with the caption correctness of
:mod:`procap.eval.correctness` (one figure: ``change``, ``type`` or ``object``), takes the difference of the two
means and a percentile bootstrap interval, resampling test pairs with replacement and scoring both models on the
same resample (the pairing). With several training seeds per model (one prediction set per seed, all on the same
pairs), the difference is the mean over seeds and each resample of the pairs is applied to every seed, so that
interval covers the test set's sampling only. The training seeds can disagree far more than the test pairs do, so
a second interval is computed over the seeds: Student's t on each seed's difference (``seed_low`` / ``seed_high``,
from two seeds on). :func:`paired_contrast` does the same for any weighted sum of models, such as the interaction of
a 2 x 2 design.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from procap.core.errors import ProCapError
from procap.eval.correctness import PairTruth, parse_caption

# figure -> (which pairs count, whether a prediction is right about that pair)
PAIRED_FIGURES = ("change", "type", "object")
MAX_RESAMPLES = 100_000


def _counts(figure: str, truth: PairTruth) -> bool:
    if figure == "change":
        return True
    if figure == "type":
        return truth.is_change
    return truth.is_change and truth.object is not None


def _right(figure: str, caption: str, truth: PairTruth) -> bool:
    parsed = parse_caption(caption)
    if figure == "change":
        return parsed.detects(truth)
    if figure == "type":
        return parsed.names_type_of(truth)
    return parsed.object == truth.object


def student_t_quantile(probability: float, df: int) -> float:
    """The ``probability`` quantile of Student's t distribution with ``df`` degrees of freedom.

    The distribution function has a closed form for whole ``df`` (a finite trigonometric series, odd and even ``df``
    apart); the quantile is found by bisection on it, to about 1e-9.
    """
    if not 0.0 < probability < 1.0:
        raise ProCapError(f"probability must be in (0, 1), got {probability}.")
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ProCapError(f"df must be a whole number of at least 1, got {df!r}.")
    if probability < 0.5:
        return -student_t_quantile(1.0 - probability, df)
    target = 2.0 * probability - 1.0  # the probability of |T| < t
    low, high = 0.0, 1.0
    while _central_t_probability(high, df) < target:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        low, high = (middle, high) if _central_t_probability(middle, df) < target else (low, middle)
        if high - low < 1e-10 * max(1.0, high):
            break
    return (low + high) / 2.0


def _central_t_probability(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with whole ``df`` (t >= 0)."""
    theta = math.atan(t / math.sqrt(df))
    cos2 = math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) * (1 + cos^2/2 + 1*3 cos^4/(2*4) + ...), df/2 terms
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= cos2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    total = 0.0  # (2/pi) (theta + sin cos (1 + 2 cos^2/3 + ...)), (df - 1)/2 terms after theta
    if df > 1:
        term, total = 1.0, 1.0
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            total += term
        total *= math.sin(theta) * math.cos(theta)
    return 2.0 / math.pi * (theta + total)


def seed_interval(per_seed: Sequence[float], level: float = 0.95) -> tuple[float | None, float | None]:
    """The ``level`` interval of the mean of ``per_seed`` (one value per training seed), Student's t on their spread;
    ``(None, None)`` with one seed, which has no spread to measure."""
    count = len(per_seed)
    if count < 2:
        return None, None
    mean = statistics.fmean(per_seed)
    half = student_t_quantile(0.5 + level / 2.0, count - 1) * statistics.stdev(per_seed) / math.sqrt(count)
    return mean - half, mean + half


def pair_hits(figure: str, predictions: Mapping[str, str], truths: Mapping[str, PairTruth]) -> dict[str, bool]:
    """Per pair id, whether ``predictions`` is right about it for ``figure``, over the pairs the figure counts."""
    if figure not in PAIRED_FIGURES:
        raise ProCapError(f"figure must be one of {', '.join(PAIRED_FIGURES)}, got {figure!r}.")
    return {i: _right(figure, predictions[i], t) for i, t in truths.items() if i in predictions and _counts(figure, t)}


def _checked_hits(
    figure: str,
    terms: Sequence[tuple[float, Sequence[Mapping[str, str]]]],
    truths: Mapping[str, PairTruth],
    counts: list[int],
    resamples: int,
    level: float,
) -> tuple[list[list[dict[str, bool]]], list[str]]:
    """:func:`paired_contrast`'s arguments checked, and each model's and seed's hits with the pair ids they share."""
    if len(terms) < 2 or not counts[0] or len(set(counts)) != 1:
        raise ProCapError(
            f"a contrast needs two or more models with one prediction set per seed, the same number of each; got "
            f"{counts}."
        )
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise ProCapError(f"resamples must be between 1 and {MAX_RESAMPLES:,}, got {resamples}.")
    if not 0.0 < level < 1.0:
        raise ProCapError(f"level must be in (0, 1), got {level}.")
    hits = [[pair_hits(figure, p, truths) for p in predictions] for _, predictions in terms]
    ids = sorted(hits[0][0])
    if not ids:
        raise ProCapError(f"no test pair counts for {figure!r}: the predictions cover none of the truths' pairs.")
    if any(sorted(h) != ids for per_model in hits for h in per_model):
        raise ProCapError("the models' predictions must cover the same test pairs in every seed.")
    return hits, ids


def paired_contrast(
    figure: str,
    terms: Sequence[tuple[float, Sequence[Mapping[str, str]]]],
    truths: Mapping[str, PairTruth],
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """A weighted sum of several models' accuracies about ``figure`` (a contrast), with a bootstrap interval.

    ``[(1, a), (-1, b)]`` is a minus b (:func:`paired_difference`); ``[(1, a), (-1, b), (-1, c), (1, d)]`` is the
    interaction of a 2 x 2 design, (a - b) - (c - d). Each resample of the test pairs is applied to every model and
    every seed.

    Args:
        figure: ``change`` (all pairs), ``type`` (change pairs) or ``object`` (change pairs with a known object).
        terms: ``(weight, predictions)`` per model, ``predictions`` one ``{pair id: caption}`` per training seed,
            the same number for every model, in seed order (seed i of one is paired with seed i of the others).
        truths: ground truth per pair id (:func:`procap.eval.correctness.scene_truths`).
        resamples: bootstrap resamples of the test pairs (1 to 100,000).
        level: the interval's coverage, in (0, 1).
        seed: the resampling's random seed.

    Returns:
        ``{"figure", "pairs", "seeds", "accuracies", "difference", "low", "high", "level", "per_seed", "seed_low",
        "seed_high"}``: each term's mean accuracy over seeds, the contrast (fractions), the bootstrap interval's
        bounds (test pairs), each seed's contrast and the interval over seeds (:func:`seed_interval`; None with one
        seed).

    Raises:
        ProCapError: naming the argument, for an unknown figure, seed counts that differ or are zero, prediction
            sets that do not cover the same pairs, or a resample count or level out of range.
    """
    counts = [len(predictions) for _, predictions in terms]
    hits, ids = _checked_hits(figure, terms, truths, counts, resamples, level)
    weights = [weight for weight, _ in terms]
    seeds = range(counts[0])

    def contrast(i: str, s: int) -> float:
        return sum(w * int(per_model[s][i]) for w, per_model in zip(weights, hits))

    # per pair: the mean over seeds of the weighted sum of "right"; the resamples draw from these
    gaps = [statistics.fmean(contrast(i, s) for s in seeds) for i in ids]
    rng = random.Random(seed)
    n = len(ids)
    draws = sorted(statistics.fmean(rng.choices(gaps, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    per_seed = [statistics.fmean(contrast(i, s) for i in ids) for s in seeds]
    seed_low, seed_high = seed_interval(per_seed, level)
    return {
        "figure": figure,
        "pairs": n,
        "seeds": counts[0],
        "accuracies": [statistics.fmean(statistics.fmean(h.values()) for h in per_model) for per_model in hits],
        "difference": statistics.fmean(gaps),
        "low": draws[min(resamples - 1, int(tail * resamples))],
        "high": draws[min(resamples - 1, max(0, int((1.0 - tail) * resamples) - 1))],
        "level": level,
        "per_seed": per_seed,
        "seed_low": seed_low,
        "seed_high": seed_high,
    }


def paired_difference(
    figure: str,
    model: Sequence[Mapping[str, str]],
    baseline: Sequence[Mapping[str, str]],
    truths: Mapping[str, PairTruth],
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """How much more often ``model`` is right than ``baseline`` about ``figure``: :func:`paired_contrast` of the two.

    Args:
        model, baseline: one ``{pair id: caption}`` per training seed, the same number for both, in seed order.
        figure, truths, resamples, level, seed: as for :func:`paired_contrast`.

    Returns:
        ``{"figure", "pairs", "seeds", "model_accuracy", "baseline_accuracy", "difference", "low", "high",
        "level", "per_seed", "seed_low", "seed_high"}``: the mean accuracies over seeds, their difference (model -
        baseline, fractions), the bootstrap interval's bounds, each seed's difference and the interval over seeds.

    Raises:
        ProCapError: as :func:`paired_contrast`.
    """
    if not model or len(model) != len(baseline):
        raise ProCapError(
            f"model and baseline need one prediction set per seed, the same number of each; got {len(model)} and "
            f"{len(baseline)}."
        )
    result = paired_contrast(figure, [(1.0, model), (-1.0, baseline)], truths, resamples, level, seed)
    model_accuracy, baseline_accuracy = result.pop("accuracies")
    return {**result, "model_accuracy": model_accuracy, "baseline_accuracy": baseline_accuracy}
