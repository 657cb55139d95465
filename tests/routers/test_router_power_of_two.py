"""p2c: SGLang gateway power_of_two, two distinct random workers, the less loaded wins, ties to the first."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from policies.power_of_two import PowerOfTwoRouter
from sim.engines.interface import EngineLoad
from tests.support.router_fakes import FakeView, build, prompt


def test_the_pair_is_two_distinct_workers_uniform_over_ordered_pairs():
    # i1 ~ U{0..3}, i2 = i1 + 1 + U{0..2} mod 4: all 12 ordered pairs, each about 1/12 of the draws, never i1 == i2.
    r = build(PowerOfTwoRouter, n=4, seed=3)
    pairs = Counter(r.sample_pair() for _ in range(12000))
    assert len(pairs) == 12 and all(a != b for a, b in pairs)
    assert all(850 < c < 1150 for c in pairs.values())


def test_the_less_loaded_of_the_pair_wins_and_ties_go_to_the_first():
    # The router's pair for seed 0 is replayed by a twin random stream; worker loads make each branch explicit.
    r = build(PowerOfTwoRouter, n=4, seed=0)
    twin = random.Random(0)
    view = FakeView(4)
    for loads in ([0, 0, 0, 0], [5, 1, 3, 0], [0, 2, 2, 9]):
        r.in_flight[:] = loads
        first = twin.randrange(4)
        second = (first + 1 + twin.randrange(3)) % 4
        expected = first if loads[first] <= loads[second] else second
        assert r.route(prompt(1, 0), view) == expected


def test_the_most_loaded_worker_is_never_chosen_and_the_least_loaded_most_often():
    # Loads 10, 5, 0: worker 0 loses every pair it is in; worker 2 wins every pair it is in (2/3 of the draws),
    # worker 1 only the pair (0, 1) in either order (1/3).
    r = build(PowerOfTwoRouter, n=3, seed=1)
    r.in_flight[:] = [10, 5, 0]
    picks = Counter(r.route(prompt(i, 0), FakeView(3)) for i in range(3000))
    assert picks[0] == 0 and 1900 < picks[2] < 2100 and 900 < picks[1] < 1100


def test_engine_load_compares_polled_kv_usage_not_in_flight():
    # The router has 3 requests in flight on worker 0 and none on worker 1, but the poller last read worker 0 at 10%
    # KV usage and worker 1 at 60%: with load=engine worker 0 wins every pair; the poll interval is the gateway's 10 s.
    scraped = [EngineLoad(kv_usage=0.1), EngineLoad(kv_usage=0.6)]
    view = FakeView(2, scraped=scraped)
    r = build(PowerOfTwoRouter, n=2, view=view, load="engine")
    r.in_flight[:] = [3, 0]
    assert {r.route(prompt(i, 0), view) for i in range(20)} == {0}
    assert set(view.scrape_intervals) == {10.0}
    by_count = build(PowerOfTwoRouter, n=2, view=view)
    by_count.in_flight[:] = [3, 0]
    assert {by_count.route(prompt(i, 0), view) for i in range(20)} == {1}


def test_one_worker_needs_no_draw():
    r = build(PowerOfTwoRouter, n=1)
    state = r.rng.getstate()
    assert r.route(prompt(1, 0), FakeView(1)) == 0 and r.rng.getstate() == state


def test_defaults_and_bad_options():
    r = build(PowerOfTwoRouter)
    assert (r.options.load, r.options.scrape_interval_s) == ("in_flight", 10.0)
    with pytest.raises(ValueError, match="load"):
        build(PowerOfTwoRouter, load="tokens")


def test_same_seed_same_choices():
    def choices(seed):
        r = build(PowerOfTwoRouter, seed=seed)
        r.in_flight[:] = [4, 0, 2, 2, 1, 3]
        return [r.route(prompt(i, 0), FakeView(6)) for i in range(40)]

    assert choices(8) == choices(8) and choices(8) != choices(9)
