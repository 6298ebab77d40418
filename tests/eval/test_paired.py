"""Paired bootstrap comparisons (procap.eval.paired): the figures, the pairing, the interval and the checks."""

from __future__ import annotations

import random
import statistics

import pytest

from procap.core.errors import ProCapError
from procap.eval.correctness import NO_CHANGE, PairTruth
from procap.eval.paired import pair_hits, paired_contrast, paired_difference, seed_interval, student_t_quantile

RED_CUBE = {"size": "small", "color": "red", "material": "rubber", "shape": "cube"}
RIGHT = "the small red rubber cube changed to blue"
WRONG_OBJECT = "the large gray metal sphere changed to blue"
NO = "there is no change"


def truths(changes: int, distractors: int) -> dict[str, PairTruth]:
    rows = {f"c{i}": PairTruth("color", dict(RED_CUBE), "blue") for i in range(changes)}
    rows.update({f"d{i}": PairTruth(NO_CHANGE) for i in range(distractors)})
    return rows


def test_each_figure_counts_its_own_pairs():
    truth = truths(2, 2)
    predictions = {"c0": RIGHT, "c1": WRONG_OBJECT, "d0": NO, "d1": RIGHT}
    assert pair_hits("change", predictions, truth) == {"c0": True, "c1": True, "d0": True, "d1": False}
    assert pair_hits("type", predictions, truth) == {"c0": True, "c1": True}
    assert pair_hits("object", predictions, truth) == {"c0": True, "c1": False}


def test_a_gap_decided_by_many_pairs_excludes_zero_and_one_by_few_does_not():
    truth = truths(200, 0)
    better = {i: RIGHT for i in truth}
    worse = {i: (WRONG_OBJECT if n % 2 else RIGHT) for n, i in enumerate(truth)}  # right on half
    wide = paired_difference("object", [better], [worse], truth, resamples=500)
    assert (
        wide["model_accuracy"] == 1.0 and wide["baseline_accuracy"] == 0.5 and wide["difference"] == pytest.approx(0.5)
    )
    assert 0.38 < wide["low"] < 0.5 < wide["high"] < 0.62
    few = truths(6, 0)
    one_apart = {i: RIGHT for i in few}
    one_wrong = {**one_apart, "c0": WRONG_OBJECT}
    narrow = paired_difference("object", [one_apart], [one_wrong], few, resamples=500)
    assert narrow["low"] <= 0.0 < narrow["high"]


def test_the_pairing_cancels_what_both_models_get_wrong():
    """Both models miss the same hard pairs: the paired interval is as narrow as the disagreement allows."""
    truth = truths(100, 0)
    hard = {f"c{i}" for i in range(50)}
    model = {i: WRONG_OBJECT if i in hard else RIGHT for i in truth}
    baseline = {**model, "c99": WRONG_OBJECT}
    result = paired_difference("object", [model], [baseline], truth, resamples=400)
    assert result["difference"] == pytest.approx(0.01)
    assert result["low"] >= 0.0 and result["high"] <= 0.04  # unpaired, the two 50 % accuracies would span +-14 %


def test_seeds_average_and_are_reported_one_by_one():
    truth = truths(40, 40)
    rng = random.Random(3)
    model = [{i: rng.choice((RIGHT, NO)) for i in truth} for _ in range(3)]
    baseline = [{i: NO for i in truth} for _ in range(3)]
    result = paired_difference("change", model, baseline, truth, resamples=200)
    expected = [statistics.fmean(pair_hits("change", m, truth).values()) - 0.5 for m in model]
    assert result["per_seed"] == pytest.approx(expected)
    assert result["difference"] == pytest.approx(statistics.fmean(expected))
    assert result["seeds"] == 3 and result["pairs"] == 80 and result["low"] <= result["difference"] <= result["high"]
    half = 4.302653 * statistics.stdev(expected) / 3**0.5  # t(0.975, 2 degrees of freedom)
    assert (result["seed_low"], result["seed_high"]) == pytest.approx(
        (result["difference"] - half, result["difference"] + half)
    )
    # deterministic in its seed
    assert paired_difference("change", model, baseline, truth, resamples=200) == result
    one = paired_difference("change", model[:1], baseline[:1], truth, resamples=200)
    assert one["seed_low"] is None and one["seed_high"] is None  # one seed has no spread to measure


@pytest.mark.parametrize(
    ("probability", "df", "expected"),
    # the printed tables of Student's t
    [
        (0.975, 1, 12.7062),
        (0.975, 2, 4.3027),
        (0.975, 4, 2.7764),
        (0.975, 9, 2.2622),
        (0.95, 3, 2.3534),
        (0.995, 7, 3.4995),
        (0.975, 30, 2.0423),
        (0.975, 120, 1.9799),
    ],
)
def test_student_t_quantiles_match_the_tables(probability, df, expected):
    assert student_t_quantile(probability, df) == pytest.approx(expected, abs=1e-4)
    assert student_t_quantile(1.0 - probability, df) == pytest.approx(-expected, abs=1e-4)


def test_student_t_refuses_what_has_no_quantile():
    with pytest.raises(ProCapError, match="probability"):
        student_t_quantile(1.0, 3)
    with pytest.raises(ProCapError, match="df"):
        student_t_quantile(0.975, 0)
    with pytest.raises(ProCapError, match="df"):
        student_t_quantile(0.975, 2.5)


def test_seeds_that_disagree_widen_the_seed_interval_not_the_pairs_one():
    """Three seeds whose gaps are +40, +10 and -20 points on 200 pairs: the test pairs decide the mean's +10 closely,
    the seeds do not."""
    truth = truths(200, 0)
    ids = list(truth)
    baseline = [{i: (RIGHT if n % 2 else WRONG_OBJECT) for n, i in enumerate(ids)}] * 3  # right on half

    def turned(gain: int) -> dict[str, str]:
        """The baseline with ``abs(gain)`` of its wrong (gain > 0) or right (gain < 0) pairs turned over."""
        turn = RIGHT if gain > 0 else WRONG_OBJECT
        chosen = [i for i in ids if baseline[0][i] != turn][: abs(gain)]
        return {**baseline[0], **dict.fromkeys(chosen, turn)}

    model = [turned(80), turned(20), turned(-40)]
    result = paired_difference("object", model, baseline, truth, resamples=400)
    assert result["per_seed"] == pytest.approx([0.4, 0.1, -0.2])
    assert result["low"] > 0.0  # the pairs' interval excludes 0 ...
    assert result["seed_low"] < 0.0 < result["seed_high"]  # ... the seeds' does not
    assert seed_interval(result["per_seed"]) == pytest.approx((result["seed_low"], result["seed_high"]))
    assert seed_interval([0.1]) == (None, None) and seed_interval([0.2, 0.2]) == pytest.approx((0.2, 0.2))


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"figure": "bleu"}, "figure"),
        ({"baseline": []}, "model and baseline"),
        ({"resamples": 0}, "resamples"),
        ({"resamples": 10**6}, "resamples"),
        ({"level": 1.0}, "level"),
        ({"baseline": [{"c0": RIGHT}]}, "same test pairs"),
        ({"truths": {"x": PairTruth(NO_CHANGE)}}, "no test pair"),
    ],
)
def test_bad_arguments_get_one_sentence(arguments, named):
    truth = truths(2, 2)
    predictions = [{i: NO for i in truth}]
    call = {"figure": "change", "model": predictions, "baseline": predictions, "truths": truth, **arguments}
    with pytest.raises(ProCapError, match=named):
        paired_difference(**call)


def test_the_interaction_contrast_of_a_2x2():
    # (a - b) - (c - d) per pair: a gains over b only where c does not gain over d; the two-term contrast is
    # paired_difference itself.
    truth = truths(100, 0)
    ids = list(truth)
    a = {i: RIGHT for i in ids}
    b = {i: (WRONG_OBJECT if n < 50 else RIGHT) for n, i in enumerate(ids)}  # a - b = 0.5
    c = {i: (RIGHT if n < 80 else WRONG_OBJECT) for n, i in enumerate(ids)}
    d = {i: (WRONG_OBJECT if n < 10 else c[i]) for n, i in enumerate(ids)}  # c - d = 0.1
    interaction = paired_contrast("object", [(1, [a]), (-1, [b]), (-1, [c]), (1, [d])], truth, resamples=400)
    assert interaction["difference"] == pytest.approx(0.4) and interaction["low"] > 0.25
    assert interaction["accuracies"] == pytest.approx([1.0, 0.5, 0.8, 0.7])
    assert interaction["per_seed"] == pytest.approx([0.4])
    two = paired_contrast("object", [(1, [a]), (-1, [b])], truth, resamples=400)
    one = paired_difference("object", [a], [b], truth, resamples=400)
    assert (two["difference"], two["low"], two["high"]) == (one["difference"], one["low"], one["high"])
    with pytest.raises(ProCapError, match="two or more models"):
        paired_contrast("object", [(1, [a])], truth)
    with pytest.raises(ProCapError, match=r"the same number of each; got \[1, 2\]"):
        paired_contrast("object", [(1, [a]), (-1, [b, b])], truth)
