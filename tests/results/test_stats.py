"""The statistics every study shares (`sim.results.stats`): Student-t intervals over repeats, the aggregation of runs,
and the Pareto front, each narrated and, where it has a naive counterpart, property-tested against it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.results.stats import over_runs, pareto_front, t_interval


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
