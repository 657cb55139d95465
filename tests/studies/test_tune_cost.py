"""`kvsim tune --objective min-cost`: the lowest fleet price per hour that meets the constraints, ties to what a
dollar buys (`usd_per_million_tokens`)."""

from __future__ import annotations

import pytest

from sim.results.stats import Interval
from sim.studies.plan import choose_router
from sim.studies.tune import Metric, Objective, Trial, _rank_key, default_pareto, lower_is_better
from sim.scenario import load_scenario


def trial(number: int, usd_per_hour: float, usd_per_million_tokens: float, feasible: bool = True) -> Trial:
    intervals = {"usd_per_hour": Interval(usd_per_hour, 0.0, 0.0, 2),
                 "usd_per_million_tokens": Interval(usd_per_million_tokens, 0.0, 0.0, 2)}
    return Trial(number, {}, "random", intervals, feasible, 0.0 if feasible else 0.3)


def test_min_cost_minimises_the_fleet_price_and_breaks_ties_by_cost_per_token():
    objective = Objective.parse("min-cost")
    assert (objective.kind, objective.column, objective.text()) == ("min-cost", "usd_per_hour", "min-cost")
    assert objective.metric == Metric("usd_per_hour", maximize=False)
    pareto = default_pareto(objective)
    assert pareto == (Metric("usd_per_hour", False), Metric("usd_per_million_tokens", False))
    # Trials 1 and 2 cost the same per hour (router knobs do not change the fleet): 2 buys tokens cheaper. Trial 3
    # is the cheapest fleet but misses a constraint; trial 0 is dearer.
    trials = [trial(0, 2.0, 1.0), trial(1, 1.0, 5.0), trial(2, 1.0, 3.0), trial(3, 0.5, 1.0, feasible=False)]
    ranked = sorted(trials, key=lambda t: _rank_key(t, objective, pareto))
    assert [t.number for t in ranked] == [2, 1, 0, 3]


def test_cost_columns_are_lower_is_better():
    assert all(lower_is_better(c) for c in ("usd_per_hour", "cost_usd", "gpu_hours", "usd_per_million_tokens"))


def test_choosing_a_router_for_min_cost_is_refused_in_one_line():
    base, _ = load_scenario()
    with pytest.raises(ValueError, match="choosing a router needs maximize:COLUMN or minimize:COLUMN, got min-cost"):
        choose_router(base, ["random"], objective="min-cost", constraints=(), budget_simulations=2, repeats=1)
