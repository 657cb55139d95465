"""The statistics every study shares (`sim.results.stats`): Student-t intervals over repeats, the aggregation of runs,
when two means are separated (and how many repeats would separate them), an interval against a limit, and the Pareto
front, each narrated and, where it has a naive counterpart, property-tested against it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.results.stats import (
    Interval, against_limit, over_runs, pareto_front, repeats_to_separate, separated, standing, t_interval,
)


def test_t_interval_of_four_values_is_the_textbook_one():
    # mean 2.5, sd sqrt(5/3), t(0.975, 3) = 3.182446305 (Student's table): 3.182446305 x 1.290994449 / 2
    iv = t_interval([1.0, 2.0, 3.0, 4.0])
    assert iv.n == 4 and iv.mean == 2.5
    assert iv.sd == pytest.approx(math.sqrt(5 / 3), rel=1e-12)
    assert iv.half_width == pytest.approx(3.182446305284263 * math.sqrt(5 / 3) / 2, rel=1e-9)
    assert iv.half_width == pytest.approx(2.0543, abs=1e-4)


def test_t_interval_of_two_values_and_of_one():
    # n = 2: the half-width is t(0.975, 1) x |a - b| / 2 = 12.7062047 x 0.1
    assert t_interval([0.1, 0.3]).half_width == pytest.approx(1.270620474, rel=1e-8)
    one = t_interval([0.4, float("nan")])  # a nan (e.g. no misses in a run) is left out
    assert one.n == 1 and one.mean == 0.4 and math.isnan(one.sd) and math.isnan(one.half_width)
    assert t_interval([]).n == 0 and math.isnan(t_interval([]).mean)


def test_over_runs_is_the_interval_of_each_column_with_gaps_left_out():
    # Three runs: b is missing from one and None in another (left out, as a NaN is); c is in one run only.
    rows = [{"a": 1.0, "b": 2.0, "c": 5.0}, {"a": 2.0, "b": None}, {"a": 3.0}]
    iv = over_runs(rows, ("a", "b", "c", "d"))
    assert iv["a"] == t_interval([1.0, 2.0, 3.0]) and iv["a"].mean == 2.0 and iv["a"].n == 3
    assert (iv["b"].mean, iv["b"].n, iv["c"].n, iv["d"].n) == (2.0, 1, 1, 0)
    assert math.isnan(iv["b"].sd) and math.isnan(iv["b"].half_width)  # one run: NaN, never 0
    assert iv["a"].columns("a") == {"a": 2.0, "a_sd": 1.0, "a_ci95": iv["a"].half_width}


# ------------------------------------------------------------------ the rule: separated = intervals do not overlap
def test_two_means_are_separated_only_when_their_intervals_do_not_overlap():
    # kvsim 10.069 ± 0.293 against llm-d 10.107 ± 0.604 (a plan router answer picked from noise): they overlap
    kvsim, llm_d = Interval(10.069, 0.118, 0.293, 3), Interval(10.107, 0.243, 0.604, 3)
    assert separated(kvsim, llm_d) is False and separated(llm_d, kvsim) is False
    # 9.153 ± 0.228 against 10.069 ± 0.293: a gap of 0.916 > 0.228 + 0.293
    assert separated(Interval(9.153, 0.092, 0.228, 3), kvsim) is True
    # touching intervals are not separated: the gap must exceed the sum
    assert separated(Interval(1.0, 0.1, 0.5, 3), Interval(2.0, 0.1, 0.5, 3)) is False
    # one run has no interval: nothing can be said
    assert separated(Interval(1.0, math.nan, math.nan, 1), Interval(5.0, 0.1, 0.1, 3)) is None


def test_repeats_to_separate_is_the_first_n_whose_half_widths_fit_in_the_gap():
    a, b = t_interval([10.0, 10.3, 9.9]), t_interval([10.1, 10.6, 9.6])
    assert separated(a, b) is False
    n = repeats_to_separate(a, b)
    # at n runs each, with the observed means and sds, the intervals just stop overlapping; at n - 1 they do not
    def at(k, iv):
        return Interval(iv.mean, iv.sd, _t(k) * iv.sd / math.sqrt(k), k)
    assert separated(at(n, a), at(n, b)) is True
    assert separated(at(n - 1, a), at(n - 1, b)) is False
    assert n == 1737  # sd 0.208 and 0.5 for a gap of 0.033: an estimate, and a discouraging one
    assert repeats_to_separate(Interval(1.0, 0.1, 0.2, 3), Interval(1.0, 0.1, 0.2, 3)) == math.inf  # equal means
    assert repeats_to_separate(Interval(1.0, 0.0, 0.0, 3), Interval(2.0, 0.0, 0.0, 3)) == 2  # no spread at all
    assert math.isnan(repeats_to_separate(Interval(1.0, math.nan, math.nan, 1), Interval(2.0, 0.1, 0.2, 3)))


def _t(n: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


@pytest.mark.parametrize("mean, half, op, limit, status", [
    (200.0, 5.0, "<=", 215.0, "met"),         # 195..205, all below 215
    (226.0, 108.0, "<=", 250.0, "undecided"),  # 118..334 straddles 250
    (258.0, 123.0, "<=", 250.0, "undecided"),  # the mean fails, the interval does not decide
    (765.0, 102.0, "<=", 250.0, "not met"),    # 663..867, all above
    (0.83, 0.02, ">=", 0.8, "met"),
    (0.79, 0.02, ">=", 0.8, "undecided"),
    (0.70, 0.02, ">=", 0.8, "not met"),
    (200.0, math.nan, "<=", 250.0, "undecided"),  # one run: its mean alone does not decide
])
def test_an_interval_against_a_limit_is_met_not_met_or_undecided(mean, half, op, limit, status):
    assert against_limit(Interval(mean, half, half, 3), op, limit) == status


def test_standing_names_the_tied_the_ahead_and_whether_it_is_settled():
    leader = Interval(10.0, 0.1, 0.3, 3)
    others = [Interval(9.0, 0.1, 0.3, 3),    # behind, separated
              Interval(9.9, 0.1, 0.3, 3),    # tied (closest)
              Interval(9.8, 0.1, 0.3, 3),    # tied
              Interval(11.0, 0.1, 0.3, 3)]   # ahead, separated
    st = standing(leader, others)
    assert st.tied == (1, 2) and st.ahead == (3,) and st.settled is False and st.label == "not settled"
    assert [st.label_of(i) for i in range(4)] == ["behind", "indistinguishable", "indistinguishable", "ahead"]
    assert st.repeats_to_separate == max(repeats_to_separate(leader, others[i]) for i in (1, 2))
    alone = standing(leader, [others[0]])
    assert alone.settled is True and alone.label == "best" and math.isnan(alone.repeats_to_separate)
    assert standing(leader, []).settled is True
    assert standing(Interval(1.0, math.nan, math.nan, 1), [others[0]]).label == "no interval"
    assert standing(Interval(10.0, 0.1, 0.3, 3), [Interval(10.5, 0.1, 0.1, 3)], maximize=False).ahead == ()


def test_pareto_front_on_a_hand_made_case():
    #            (hit rate, TTFT p99 ms)
    points = [(0.8, 400.0),   # best hit rate: on the front
              (0.7, 500.0),   # dominated by the first (lower hit rate, higher p99)
              (0.4, 180.0),   # lowest p99: on the front
              (0.4, 190.0),   # dominated by the third (same hit rate, higher p99)
              (0.8, 400.0),   # equal to the first: on the front with it
              (0.6, 250.0),   # between: on the front
              (float("nan"), 100.0)]  # no hit rate: never on the front
    assert pareto_front(points) == [True, False, True, False, True, True, False]


def _naive_front(points, maximize):
    def better_eq(p, q, i):
        return p[i] >= q[i] if maximize[i] else p[i] <= q[i]

    def dominates(p, q):
        return (better_eq(p, q, 0) and better_eq(p, q, 1)) and p != q

    return [not any(math.isnan(v) for v in p) and not any(
        dominates(q, p) for q in points if not any(math.isnan(v) for v in q)) for p in points]


coordinate = st.one_of(st.integers(0, 6).map(float), st.just(math.nan))


@settings(max_examples=400, deadline=None)
@given(points=st.lists(st.tuples(coordinate, st.integers(0, 6).map(float)), max_size=25),
       maximize=st.tuples(st.booleans(), st.booleans()))
@pytest.mark.slow
def test_pareto_front_matches_a_naive_quadratic_check(points, maximize):
    assert pareto_front(points, maximize) == _naive_front(points, maximize)
