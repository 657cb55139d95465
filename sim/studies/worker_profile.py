"""The highest request rate one worker of a scenario serves while meeting the scenario's SLO: kvsim's analogue of
Dynamo's pre-deployment profiling, whose answer (`engine_rps` at the TTFT and ITL SLAs,
`find_best_engine_agg_rps`) the SLA Planner divides the predicted load by. The `planner` autoscaler takes it as its
`worker_rps` option; the composition root calls `profile_worker` when that option is not given.

How: the scenario with one worker and an open loop, simulated for `requests` requests (the first quarter discarded:
the queue starts empty) at a rate, `seeds` times (seed, seed + 1, ...). A rate *meets* the SLO when, in every seed, at
least `attainment` of the measured requests meet every objective of `slo:` (goodput fraction). The rate is bracketed
from the scenario's own rate (or 1 req/s) by doubling or halving, then bisected geometrically until the bracket is
within `rel_tol`: the answer is the highest rate simulated that meets the SLO. Goodput is assumed to fall with load
(it does in a queue; the bisection trusts it).

A sessions workload varies its session start rate (`session_rate_per_s`); its answer is the requests per second the
passing runs completed (turns per session vary), not the session rate.

Results are cached per scenario and parameters for the life of the process (a replay, sweep or study asks once).

NOTE: a short run can pass a rate a little above the worker's capacity when the SLO constrains only TTFT: vLLM admits
up to max_num_seqs requests at once, so an overload first slows decoding (TPOT) and the waiting queue, which TTFT
sees, grows only later. Give the SLO a `tpot_ms` (Dynamo's Planner profiles against TTFT and ITL alike) or more
`requests`.

`with_worker_rps` is what a composition root calls (only `sim.cli` may: the layers put studies above the runner and
the replay) to fill the planner's `worker_rps` when its options do not give it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.config import Problem, ProblemsError
from sim.results.summary import summarize
from sim.runner import run
from sim.scenario import Scenario


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One simulated rate: the knob's value, the lowest goodput fraction over the seeds, and the mean throughput."""

    rate: float
    goodput_fraction: float
    throughput_rps: float


@dataclass(frozen=True, slots=True)
class WorkerProfile:
    """The answer: `worker_rps`, requests per second one worker serves meeting the SLO, and how it was found."""

    worker_rps: float
    knob: str
    """The workload field varied: `workload.arrival_rate_rps` or `workload.session_rate_per_s`."""
    rate: float
    """The knob's value at the answer."""
    attainment: float
    points: tuple[RatePoint, ...]
    """Every rate simulated, in the order simulated."""


_CACHE: dict[tuple, WorkerProfile] = {}
_PROFILE_SESSIONS = 50
"""Sessions per profiled rate when the scenario gives their number only through a curve's span."""


def profile_worker(scenario: Scenario, *, attainment: float = 0.95, requests: int = 200, seeds: int = 2,
                   rel_tol: float = 0.05, max_steps: int = 12) -> WorkerProfile:
    """The highest rate one worker of `scenario` meets its SLO at (see the module docstring). A one-line
    ProblemsError when the scenario sets no SLO, is disaggregated, or no rate within `max_steps` halvings meets it."""
    if not 0 < attainment <= 1 or requests < 4 or seeds < 1 or rel_tol <= 0:
        raise ValueError(f"profile_worker: need 0 < attainment <= 1, requests >= 4, seeds >= 1, rel_tol > 0; got "
                         f"{attainment}, {requests}, {seeds}, {rel_tol}")
    key = (scenario.model_dump_json(), attainment, requests, seeds, rel_tol, max_steps)
    if key in _CACHE:
        return _CACHE[key]
    slo = scenario.slo
    if slo.ttft_ms is None and slo.tpot_ms is None and slo.e2e_ms is None:
        raise ProblemsError([Problem(("slo",), "a worker profile needs the scenario's SLO (slo: {ttft_ms: ..., "
                                               "tpot_ms: ...}), or give the planner worker_rps")])
    if scenario.cluster.disaggregation is not None:
        raise ProblemsError([Problem(("cluster", "disaggregation"), "a worker profile is of an aggregated worker")])
    sessions = scenario.has_sessions
    knob = "workload.session_rate_per_s" if sessions else "workload.arrival_rate_rps"
    # NOTE: a worker is profiled at constant rates on a fixed fleet of one, as Dynamo's pre-deployment profiling
    # measures one engine: the scenario's own load curve and autoscaler are not part of the profile.
    fixed = {}
    if getattr(scenario.workload, "arrival_curve", None) is not None:
        fixed = {"workload.arrival_curve": None, "workload.duration_s": None}
        if scenario.has_sessions and scenario.workload.sessions is None:  # the curve's span gave their number
            fixed["workload.sessions"] = _PROFILE_SESSIONS
    one = scenario.with_overrides(**{"cluster.autoscaling": None, **fixed, "cluster.workers": 1})
    if not sessions:
        one = one.with_overrides(**{"workload.min_requests": requests, "workload.requests_per_prefix": 0,
                                    "workload.discard_first": requests // 4})
        start = scenario.workload.arrival_rate_rps or 1.0
    else:
        one = one.with_overrides(**{"workload.concurrent_sessions": None})
        start = scenario.workload.session_rate_per_s or 0.1
    points: dict[float, RatePoint] = {}

    def simulate(rate: float) -> RatePoint:
        if rate not in points:
            summaries = [summarize(run(one.with_overrides(**{knob: rate, "seed": scenario.seed + k})))
                         for k in range(seeds)]
            points[rate] = RatePoint(rate, min(s.goodput_fraction for s in summaries),
                                     sum(s.throughput_rps for s in summaries) / seeds)
        return points[rate]

    def meets(rate: float) -> bool:
        return simulate(rate).goodput_fraction >= attainment

    lo, hi = (start, None) if meets(start) else (None, start)
    for _ in range(max_steps):
        if lo is None:
            candidate = hi / 2
            if meets(candidate):
                lo = candidate
            else:
                hi = candidate
        elif hi is None:
            candidate = lo * 2
            if meets(candidate):
                lo = candidate
            else:
                hi = candidate
        else:
            break
    if lo is None:
        raise ProblemsError([Problem(("slo",), f"one worker meets the SLO at no rate down to {hi:.3g} "
                                               f"({knob.split('.')[-1]}): loosen the SLO or give worker_rps")])
    while hi is not None and hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    answer = points[lo]
    profile = WorkerProfile(worker_rps=answer.throughput_rps if sessions else lo, knob=knob, rate=lo,
                            attainment=attainment, points=tuple(points.values()))
    _CACHE[key] = profile
    return profile


def with_worker_rps(name: str, options: dict, scenario: Scenario) -> dict:
    """`options` of autoscaler `name`, with the planner's `worker_rps` measured for `scenario` (`profile_worker`)
    when it needs one and none is given; any other autoscaler's options unchanged."""
    if name != "planner" or options.get("worker_rps") is not None:
        return options
    return {**options, "worker_rps": profile_worker(scenario).worker_rps}
