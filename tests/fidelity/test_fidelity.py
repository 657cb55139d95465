"""Fidelity against the measured reference experiment (scenarios/reference/service-baseline.csv).

Tolerances, as the core issue states them:
* N=2: exactly the first-visit misses (each (worker, prefix) pair not covered by a warm-up misses once):
  10 of 200 at 6 workers, 4 of 200 at 3;
* token hit rate 0.814 +- 0.005 at N=2, 6 workers, concurrency 4;
* request hit rate, mean of 20 repeats per point, over the 16 measured points: RMSE <= 2 pp, max error <= 5 pp.
  (The measurement itself is a median of 3 runs of 200-480 requests: about +-2.5 pp of noise per point.)
The naive-LRU ablation (blocks freed head first) must fail the same bound: the test can tell the models apart.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import pytest

from sim.results.summary import summarize
from sim.runner import run
from sim.scenario import load_scenario
from sim.studies.reference import load_reference, measured
from sim.studies.sweep import run_sweep, sweep_points


@pytest.fixture(scope="module")
def baseline():
    scenario, path = load_scenario()
    return scenario, load_reference(path.parent / scenario.reference)


def _mean_hit_rates(scenario, points_measured, repeats):
    points = []
    for (w, n, c) in points_measured:
        points += sweep_points(workers=[w], prefixes=[n], concurrency=[c], routers=[scenario.router.name],
                               repeats=repeats, seed=scenario.seed)
    rows = [o.row for o in run_sweep(scenario, points)]
    by_point = defaultdict(list)
    for row in rows:
        by_point[(row["workers"], row["prefixes"], row["concurrency"])].append(row["request_hit_rate"])
    return {k: statistics.fmean(v) for k, v in by_point.items()}


def _rmse_and_max(sim, meas):
    errors = [sim[k] - meas[k] for k in meas]
    return math.sqrt(sum(e * e for e in errors) / len(errors)), max(abs(e) for e in errors)


@pytest.mark.parametrize("workers,expected_misses", [(6, 10), (3, 4)])
@pytest.mark.slow
def test_n2_misses_are_exactly_the_first_visits(baseline, workers, expected_misses):
    scenario, _ = baseline
    for seed in range(3):
        result = run(scenario.with_overrides(**{"cluster.workers": workers, "workload.prefixes": 2,
                                                "workload.concurrency": 8, "seed": seed}))
        warm_pairs = {(r.worker, r.prefix_id) for r in result.records if r.warmup}
        seen_pairs = {(r.worker, r.prefix_id) for r in result.measured}
        misses = [r for r in result.measured if not r.is_hit]
        assert len(misses) == len(seen_pairs - warm_pairs) == expected_misses
        assert {(r.worker, r.prefix_id) for r in misses} == seen_pairs - warm_pairs
        assert len(result.measured) == 200


def test_n2_token_hit_rate(baseline):
    scenario, reference = baseline
    expected = measured(reference, "token_hit_rate")[(6, 2, 4)]
    rates = [summarize(run(scenario.with_overrides(**{"cluster.workers": 6, "workload.prefixes": 2,
                                                      "workload.concurrency": 4, "seed": s}))).token_hit_rate
             for s in range(3)]
    assert expected == 0.814
    assert all(abs(r - expected) <= 0.005 for r in rates), rates


@pytest.mark.slow
def test_request_hit_rate_rmse_over_the_measured_points(baseline):
    scenario, reference = baseline
    meas = measured(reference, "request_hit_rate")
    assert len(meas) == 16
    sim = _mean_hit_rates(scenario, meas, repeats=20)
    rmse, worst = _rmse_and_max(sim, meas)
    print(f"kvsim (tail-first, vLLM): RMSE {100 * rmse:.2f} pp, max {100 * worst:.2f} pp")
    assert rmse <= 0.02 and worst <= 0.05


@pytest.mark.slow
def test_naive_head_first_lru_misses_the_measurements(baseline):
    # The brief's warning, checked: freeing a prefix root-first loses ~12 points at N=7.
    scenario, reference = baseline
    meas = measured(reference, "request_hit_rate")
    naive = scenario.with_overrides(**{"engine.free_order": "head-first"})
    sim = _mean_hit_rates(naive, meas, repeats=5)
    rmse, _ = _rmse_and_max(sim, meas)
    print(f"naive head-first LRU: RMSE {100 * rmse:.2f} pp, N=7 6 workers concurrency 8: {sim[(6, 7, 8)]:.3f}")
    assert rmse > 0.05
    assert sim[(6, 7, 8)] < 0.47


@pytest.mark.slow
def test_kv_aware_routing_lifts_the_hit_rate_at_n24(baseline):
    scenario, _ = baseline
    points = sweep_points(workers=[6], prefixes=[24], concurrency=[8], routers=["random", "kv-aware"],
                          repeats=5, seed=scenario.seed)
    rows = [o.row for o in run_sweep(scenario, points)]
    rate = {r: statistics.fmean(x["request_hit_rate"] for x in rows if x["router"] == r)
            for r in ("random", "kv-aware")}
    assert rate["random"] < 0.2
    assert rate["kv-aware"] > 2 * rate["random"]
