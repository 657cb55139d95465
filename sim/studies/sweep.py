"""A grid of runs over workers x prefixes x concurrency x router x host KV x repeat, run on an executor
(`sim.studies.executor`: local processes or a Dask cluster)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sim.results.records import TtftSamples
from sim.routing.spec import router_overrides
from sim.runner import build_router, run
from sim.scenario import Scenario, cpu_kv_gib, shared_kv_gib, with_cpu_kv_gib
from sim.results.summary import summarize
from sim.studies.executor import Executor, LocalExecutor, available_cores, using

__all__ = ["SweepPoint", "PointOutcome", "sweep_points", "run_point", "run_points", "run_sweep", "SweepRunner",
           "available_cores"]


@dataclass(frozen=True, slots=True)
class SweepPoint:
    workers: int
    prefixes: int
    concurrency: int
    router: str
    """Router spec label: NAME or NAME:key=value,... (`sim.routing.spec`)."""
    repeat: int
    seed: int
    engine: str | None = None
    """Engine kind (None: the base scenario's)."""
    cpu_kv_gib: float | None = None
    """Host (CPU) KV tier per worker in GiB (`engine.cpu_kv_bytes`; 0: none; None: the base scenario's)."""

    def scenario(self, base: Scenario) -> Scenario:
        if self.engine is not None:
            base = base.with_engine(self.engine)
        if self.cpu_kv_gib is not None:
            base = with_cpu_kv_gib(base, self.cpu_kv_gib)
        return base.with_overrides(**{
            "cluster.workers": self.workers,
            **workload_point(base, self.prefixes, self.concurrency),
            **router_overrides(self.router, base.router.name, base.router.options),
            "seed": self.seed,
        })


def workload_point(base: Scenario, prefixes: int, concurrency: int) -> dict[str, object]:
    """The overrides that put `base`'s workload at a point: a shared-prefix workload's N and C; a sessions
    workload's groups and sessions at once (concurrency 0: its Poisson session starts, as it has them)."""
    if not base.has_sessions:
        return {"workload.prefixes": prefixes, "workload.concurrency": concurrency}
    if concurrency:
        return {"workload.groups": prefixes, "workload.concurrent_sessions": concurrency,
                "workload.session_rate_per_s": None}
    return {"workload.groups": prefixes}


def sweep_points(
    *, workers: Iterable[int], prefixes: Iterable[int], concurrency: Iterable[int], routers: Iterable[str],
    repeats: int, seed: int, engines: Iterable[str | None] = (None,), cpu_kv_gib: Iterable[float | None] = (None,),
) -> list[SweepPoint]:
    """Every combination; repeat r runs with seed + r (so repeat 0 of every point shares the base seed, and every
    engine, router and host tier sees the same request stream)."""
    return [
        SweepPoint(w, n, c, r, k, seed + k, e, g)
        for e, g, w, n, c, r, k in itertools.product(engines, cpu_kv_gib, workers, prefixes, concurrency, routers,
                                                     range(repeats))
    ]


@dataclass(frozen=True, slots=True)
class PointOutcome:
    """One run of a sweep point: its summary row and its TTFT samples of hits and misses."""

    point: SweepPoint
    row: dict[str, object]
    ttft: TtftSamples


def run_point(base: Scenario, point: SweepPoint) -> PointOutcome:
    scenario = point.scenario(base)
    result = run(scenario)
    summary = summarize(result)
    row = {
        "workers": point.workers, "prefixes": point.prefixes, "concurrency": point.concurrency,
        "router": point.router, "engine": scenario.engine.kind, "cpu_kv_gib": cpu_kv_gib(scenario),
        "repeat": point.repeat, "seed": point.seed,
        **summary.row(),
        # NOTE: only with a shared store, so that a sweep without one keeps its columns.
        **({"shared_kv_gib": shared_kv_gib(scenario)} if scenario.shared_kv_bytes else {}),
    }
    return PointOutcome(point, row, TtftSamples.of(result.measured))


def _run_star(args: tuple[Scenario, SweepPoint]) -> PointOutcome:
    return run_point(*args)


def run_points(executor: Executor, base: Scenario, points: list[SweepPoint],
               progress: Callable[[], None] | None = None,
               on_outcome: Callable[[int, PointOutcome], None] | None = None) -> list[PointOutcome]:
    """One outcome per point, in the order of `points`, on `executor`; `on_outcome(i, outcome)` as each finishes.
    Every point (its scenario and router options) is checked before any runs."""
    for point in points:
        build_router(point.scenario(base))
    return executor.map(_run_star, [(base, p) for p in points], progress, on_outcome)


class SweepRunner(LocalExecutor):
    """A `LocalExecutor` that also runs sweep points (`run`): the name the studies used before executors."""

    def run(self, base: Scenario, points: list[SweepPoint],
            progress: Callable[[], None] | None = None) -> list[PointOutcome]:
        """One outcome per point, in the order of `points`."""
        return run_points(self, base, points, progress)


def run_sweep(base: Scenario, points: list[SweepPoint], *, jobs: int | None = None,
              progress: Callable[[], None] | None = None, executor: Executor | None = None,
              on_outcome: Callable[[int, PointOutcome], None] | None = None) -> list[PointOutcome]:
    """`run_points` on `executor`, or without one on `jobs` local processes (default: every core, at most one per
    point)."""
    with using(executor, min(jobs or available_cores(), max(1, len(points)))) as ex:
        return run_points(ex, base, points, progress, on_outcome)
