"""The clustered accuracy interval against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from tandem.eval.stats import clustered_accuracy, group_scores, wilson_interval


def test_single_repeat_matches_hand_computation() -> None:
    # 3 of 4 right: mean .75, sample sd .5, se .25, half-width 1.96*.25 = .49
    acc = clustered_accuracy({"a": [1], "b": [1], "c": [1], "d": [0]})
    assert acc.accuracy == 0.75
    assert acc.se == pytest.approx(0.25)
    assert acc.ci95_low == pytest.approx(0.75 - 1.959964 * 0.25, abs=1e-6)
    assert acc.ci95_high == 1.0  # clipped
    assert (acc.n_questions, acc.n_samples, acc.method) == (4, 4, "cluster-normal")


def test_repeats_are_clustered_by_question() -> None:
    # 8 questions, 2 repeats; question means 1,1,1,.5,.5,.5,0,0 -> mean .5625
    scores = {
        "q1": [1, 1],
        "q2": [1, 1],
        "q3": [1, 1],
        "q4": [1, 0],
        "q5": [0, 1],
        "q6": [1, 0],
        "q7": [0, 0],
        "q8": [0, 0],
    }
    acc = clustered_accuracy(scores)
    means = [1, 1, 1, 0.5, 0.5, 0.5, 0, 0]
    sd = math.sqrt(sum((m - 0.5625) ** 2 for m in means) / 7)  # 0.4173
    se = sd / math.sqrt(8)  # 0.147524
    assert acc.accuracy == pytest.approx(0.5625)
    assert acc.se == pytest.approx(se)
    assert acc.se == pytest.approx(0.147524, abs=1e-6)
    assert acc.ci95_low == pytest.approx(0.5625 - 1.959964 * se, abs=1e-6)
    assert acc.ci95_high == pytest.approx(0.5625 + 1.959964 * se, abs=1e-6)
    assert acc.n_samples == 16
    # the naive binomial interval over 16 samples is narrower: clustering widens it
    naive_se = math.sqrt(0.5625 * 0.4375 / 16)
    assert acc.se > naive_se


def test_uneven_repeats_weight_questions_equally() -> None:
    acc = clustered_accuracy({"q1": [1, 1, 1, 1], "q2": [0]})
    assert acc.accuracy == 0.5


def test_all_wrong_uses_wilson() -> None:
    acc = clustered_accuracy({f"q{i}": [0] for i in range(5)})
    assert acc.accuracy == 0
    assert acc.method == "wilson"
    assert acc.ci95_low == 0
    assert acc.ci95_high == pytest.approx(0.4345, abs=1e-4)


def test_wilson_known_value() -> None:
    # 8 of 10: Wilson 95% interval [0.4902, 0.9433]
    low, high = wilson_interval(0.8, 10)
    assert (low, high) == (pytest.approx(0.4902, abs=1e-4), pytest.approx(0.9433, abs=1e-4))


def test_empty_has_no_accuracy() -> None:
    acc = clustered_accuracy({})
    assert acc.accuracy is None and acc.n_questions == 0


def test_group_scores_keeps_first_seen_order() -> None:
    assert group_scores([("b", 1), ("a", 0), ("b", 0)]) == {"b": [1, 0], "a": [0]}
