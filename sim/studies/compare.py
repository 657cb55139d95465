"""Routers side by side on one workload: every router sees the same request stream, each point repeated.

Two workloads:

* the scenario's own (the built-in shared-prefix workload): points of `sim.studies.sweep` (`SweepPoint`,
  `run_sweep`), repeat r with seed + r, so repeat r of every router sends the same prefixes in the same order;
* a trace: replayed open loop (`sim.replay.replay`) once per (workers, router, repeat), repeat r with seed + r too
  (the trace is the same every time; only routers that draw random numbers differ between repeats).

Per (workers, N, concurrency) and router the repeats are summarised as a mean, a standard deviation and the
half-width of a 95 % Student-t interval of the mean; routers are then placed against the bound and marked when
they are on the Pareto frontier of (primary metric up, TTFT p99 down). The primary metric is the request hit rate
(built-in workload) or the prefix reuse = cached / prompt tokens (traces). On the primary metric and on the objective
(throughput, or goodput with an SLO) each point's leader is said to lead only when it is separated from the runner-up
beyond the intervals (`sim.results.stats.standing`); otherwise the top routers are indistinguishable at this number
of repeats.

Bounds (C = KV tokens per worker / prompt tokens, `Scenario.kv_capacity_requests`: the prompts one worker holds):

    bound               min(1, W·C/N)   the cluster's W caches hold W·C prompts: with every prefix on one worker
                                        and no load limits, at most that share of the N prefixes hits
                                        (`analytic.prefix_routing_bound`)
    random expectation  min(1, C/N)     each worker holds C of the N prefixes whatever the router did (the
                                        measured experiment's rule, `analytic.formula_hit_rate`)

For a trace the bound is `reuse_available` (what one infinite cache shared by the cluster would hit) and there is no
random expectation. Pure: this module runs and aggregates; only the CLI prints and writes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sim.replay import Trace, replay
from sim.results.stats import Interval, Standing, over_runs, pareto_front, repeats_to_separate, standing
from sim.routing.spec import router_overrides
from sim.runner import build_router
from sim.scenario import Scenario
from sim.studies.analytic import formula_hit_rate, prefix_routing_bound
from sim.studies.executor import Executor, available_cores, using

METRICS = (
    "request_hit_rate", "full_hit_rate", "token_hit_rate", "prefix_reuse", "reuse_available", "reuse_captured",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "throughput_rps", "max_worker_share", "view_false_hit_rate",
    "goodput_rps", "goodput_fraction", "imbalance_max_mean", "jain_index", "tpot_p99_ms", "e2e_p99_ms",
    "cost_usd", "usd_per_million_tokens", "usd_per_million_slo_requests",
)
"""Columns summarised over repeats, each where the rows have it (a trace's rows have `prefix_reuse`, the built-in
workload's `full_hit_rate`; the SLO and balance columns from `goodput_rps` on, and the cost columns, come with newer
`Summary.row()`s)."""

POINT_KEYS = ("workers", "prefixes", "concurrency")
"""What makes a point (a panel, a table); prefixes and concurrency are None for a trace."""


# --- traces: one replay per (workers, router, repeat) ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TracePoint:
    workers: int
    router: str
    """Router spec label: NAME or NAME:key=value,... (`sim.routing.spec`)."""
    repeat: int
    seed: int

    def scenario(self, base: Scenario) -> Scenario:
        return base.with_overrides(**{
            "cluster.workers": self.workers,
            **router_overrides(self.router, base.router.name, base.router.options),
            "seed": self.seed,
        })


def trace_points(*, workers: Iterable[int], routers: Iterable[str], repeats: int, seed: int) -> list[TracePoint]:
    """Every (workers, router, repeat); repeat r with seed + r, as `sim.studies.sweep.sweep_points`."""
    return [TracePoint(w, r, k, seed + k) for w in workers for r in routers for k in range(repeats)]


def run_trace_point(base: Scenario, point: TracePoint, open_trace: Callable[[], Trace]) -> dict[str, object]:
    """One replay of the trace (opened anew by `open_trace`) as a row: the point's keys and `ReplayResult.row()`."""
    scenario = point.scenario(base)
    result = replay(scenario, open_trace)
    stats = result.stats
    return {
        "workers": point.workers, "prefixes": None, "concurrency": None, "router": point.router,
        "engine": scenario.engine.kind, "repeat": point.repeat, "seed": point.seed,
        **result.row(),
        # NOTE: the reuse the real caches delivered is the prefix reuse (the names of `summary.csv`).
        "reuse_delivered": stats.prefix_reuse,
        "max_worker_share": stats.max_worker_share,
    }


def _trace_star(args: tuple[Scenario, TracePoint, Callable[[], Trace]]) -> dict[str, object]:
    return run_trace_point(*args)


def run_trace(base: Scenario, points: list[TracePoint], open_trace: Callable[[], Trace], *, jobs: int | None = None,
              progress: Callable[[], None] | None = None, executor: Executor | None = None,
              on_row: Callable[[int, dict[str, object]], None] | None = None) -> list[dict[str, object]]:
    """A row per point, in order, the replays spread over `jobs` processes (`open_trace` must be picklable, e.g. a
    `functools.partial` of `read_mooncake`), on `executor` when given; `on_row(i, row)` as each finishes."""
    for point in points:
        build_router(point.scenario(base))  # every point's router checked before any runs
    with using(executor, min(jobs or available_cores(), max(1, len(points)))) as runner:
        return runner.map(_trace_star, [(base, p, open_trace) for p in points], progress, on_row)


# --- the summary over repeats ---------------------------------------------------------------------------------------

def aggregate_routers(rows: Sequence[dict[str, object]], *, capacity_requests: float | None,
                      primary_metric: str = "prefix_reuse",
                      objective: str = "throughput_rps") -> list[dict[str, object]]:
    """Per point and router: every metric of `METRICS` the rows have as `m`, `m_sd`, `m_ci95` (mean, sd, 95 %
    t-interval half-width over repeats); `primary_metric`; `bound`, `random_expectation`, `fraction_of_bound`
    (primary / bound, and `_ci95`); `on_front` (Pareto: primary up, TTFT p99 down, among the point's routers);
    `verdict` and `repeats_to_separate` on the primary metric, `objective` (the column, higher is better),
    `objective_verdict` and `objective_repeats_to_separate` on it (`mark_verdicts`).

    With `capacity_requests` C (the built-in workload) the primary metric is the request hit rate, the bound
    min(1, W·C/N) and the random expectation min(1, C/N); without (a trace, sessions) the primary metric is
    `primary_metric` (a trace's prefix reuse; a run's token_hit_rate, the same ratio), the bound the reuse available
    and there is no random expectation. Points in ascending order, routers
    within a point by the primary metric, highest first.
    """
    primary = "request_hit_rate" if capacity_requests is not None else primary_metric
    present = [m for m in METRICS if any(m in row for row in rows)]
    groups: dict[tuple, dict[tuple, list[dict[str, object]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        point = tuple(row.get(k) for k in POINT_KEYS)
        groups[point][(row["router"], row.get("engine"))].append(row)
    out: list[dict[str, object]] = []
    for point in sorted(groups, key=lambda p: tuple(-1 if v is None else v for v in p)):
        workers, prefixes, _conc = point
        block = []
        for (router, engine), members in groups[point].items():
            agg: dict[str, object] = {**dict(zip(POINT_KEYS, point)), "router": router, "engine": engine,
                                      "repeats": len(members), "primary_metric": primary}
            for m, interval in over_runs(members, present).items():
                agg.update(interval.columns(m))
            if capacity_requests is not None:
                agg["bound"] = prefix_routing_bound(int(workers), capacity_requests, int(prefixes))
                agg["random_expectation"] = formula_hit_rate(capacity_requests, int(prefixes))
            else:
                agg["bound"] = agg.get("reuse_available", math.nan)
                agg["random_expectation"] = math.nan
            bound = float(agg["bound"])
            ok = bound > 0 and not math.isnan(bound)
            agg["fraction_of_bound"] = float(agg[primary]) / bound if ok else math.nan
            agg["fraction_of_bound_ci95"] = float(agg[f"{primary}_ci95"]) / bound if ok else math.nan
            block.append(agg)
        front = pareto_front([(float(a[primary]), float(a["ttft_p99_ms"])) for a in block])
        for agg, on in zip(block, front):
            agg["on_front"] = on
        block.sort(key=lambda a: (-_or(float(a[primary]), -math.inf), str(a["router"])))
        mark_verdicts(block, primary, "")
        for agg in block:
            agg["objective"] = objective
        mark_verdicts(block, objective, "objective_")
        out.extend(block)
    return out


def interval_of(agg: dict[str, object], metric: str) -> Interval:
    """A metric's interval back from an aggregated row's `m`, `m_sd`, `m_ci95` and `repeats`."""
    return Interval(*(float(agg.get(k, math.nan)) for k in (metric, f"{metric}_sd", f"{metric}_ci95")),
                    int(agg["repeats"]))


def lead(block: Sequence[dict[str, object]], metric: str) -> tuple[int, Standing, list[int]] | None:
    """One point's routers (aggregated rows) on `metric`, higher better: the leader's index, its standing against
    the others (THE RULE of `sim.results.stats`) and the others' indices; None when no router has the metric."""
    present = [i for i, a in enumerate(block) if not math.isnan(interval_of(a, metric).mean)]
    if not present:
        return None
    leader = max(present, key=lambda i: (interval_of(block[i], metric).mean, -i))
    others = [i for i in present if i != leader]
    return leader, standing(interval_of(block[leader], metric), [interval_of(block[i], metric) for i in others]), others


def mark_verdicts(block: list[dict[str, object]], metric: str, prefix: str) -> None:
    """Sets `{prefix}verdict` on each router of a point: the leader's "best" (separated from every other), "not
    settled" or "no interval" (one run); another's "indistinguishable" or "behind"; and `{prefix}repeats_to_separate`,
    the estimated runs that would separate the leader from the tied (on the leader's row) or from this router."""
    for agg in block:
        agg[f"{prefix}verdict"], agg[f"{prefix}repeats_to_separate"] = "", math.nan
    found = lead(block, metric)
    if found is None:
        return
    leader, st, others = found
    block[leader][f"{prefix}verdict"] = st.label
    block[leader][f"{prefix}repeats_to_separate"] = st.repeats_to_separate
    for j, i in enumerate(others):
        block[i][f"{prefix}verdict"] = st.label_of(j)
        if j in st.tied:
            block[i][f"{prefix}repeats_to_separate"] = repeats_to_separate(interval_of(block[leader], metric),
                                                                           interval_of(block[i], metric))


def _or(value: float, default: float) -> float:
    return default if math.isnan(value) else value


def compare_columns(aggregated: Sequence[dict[str, object]]) -> list[str]:
    """compare.csv's columns: the point, the router, the bound and the front, then mean, sd, ci95 per metric."""
    head = [*POINT_KEYS, "router", "engine", "repeats", "primary_metric", "bound", "random_expectation",
            "fraction_of_bound", "fraction_of_bound_ci95", "on_front"]
    present = [m for m in METRICS if any(m in a for a in aggregated)]
    return head + [f"{m}{s}" for m in present for s in ("", "_sd", "_ci95")] + [
        "verdict", "repeats_to_separate", "objective", "objective_verdict", "objective_repeats_to_separate"]
