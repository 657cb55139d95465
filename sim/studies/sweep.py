"""A grid of runs over workers x prefixes x concurrency x router x repeat, run in parallel processes."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from sim.results.records import TtftSamples
from sim.routing.spec import router_overrides
from sim.runner import build_router, run
from sim.scenario import Scenario
from sim.results.summary import summarize


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

    def scenario(self, base: Scenario) -> Scenario:
        if self.engine is not None:
            base = base.with_engine(self.engine)
        return base.with_overrides(**{
            "cluster.workers": self.workers,
            "workload.prefixes": self.prefixes,
            "workload.concurrency": self.concurrency,
            **router_overrides(self.router, base.router.name, base.router.options),
            "seed": self.seed,
        })


def sweep_points(
    *, workers: Iterable[int], prefixes: Iterable[int], concurrency: Iterable[int], routers: Iterable[str],
    repeats: int, seed: int, engines: Iterable[str | None] = (None,),
) -> list[SweepPoint]:
    """Every combination; repeat r runs with seed + r (so repeat 0 of every point shares the base seed, and every
    engine and router sees the same request stream)."""
    return [
        SweepPoint(w, n, c, r, k, seed + k, e)
        for e, w, n, c, r, k in itertools.product(engines, workers, prefixes, concurrency, routers, range(repeats))
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
        "router": point.router, "engine": scenario.engine.kind, "repeat": point.repeat, "seed": point.seed,
        **summary.row(),
    }
    return PointOutcome(point, row, TtftSamples.of(result.measured))


def _run_star(args: tuple[Scenario, SweepPoint]) -> PointOutcome:
    return run_point(*args)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform tells, else all of the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class SweepRunner:
    """Runs sweep points in `jobs` processes (default: all available cores), keeping the processes between calls."""

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = max(1, jobs or available_cores())
        self._pool = ProcessPoolExecutor(max_workers=self.jobs) if self.jobs > 1 else None

    def __enter__(self) -> SweepRunner:
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def map(self, fn: Callable, items: list, progress: Callable[[], None] | None = None) -> list:
        """`fn` over `items` (picklable), in the worker processes, results in order; `progress` after each."""
        if self._pool is None or len(items) <= 1:
            results = map(fn, items)
        else:
            results = self._pool.map(fn, items, chunksize=max(1, len(items) // (self.jobs * 8)))
        out = []
        for result in results:
            out.append(result)
            if progress:
                progress()
        return out

    def run(self, base: Scenario, points: list[SweepPoint],
            progress: Callable[[], None] | None = None) -> list[PointOutcome]:
        """One outcome per point, in the order of `points`."""
        for point in points:
            build_router(point.scenario(base))  # validate every point (router options too) before running any
        tasks = [(base, p) for p in points]
        if self._pool is None or len(points) == 1:
            results = map(_run_star, tasks)
        else:
            results = self._pool.map(_run_star, tasks, chunksize=max(1, len(points) // (self.jobs * 8)))
        outcomes = []
        for outcome in results:
            outcomes.append(outcome)
            if progress:
                progress()
        return outcomes


def run_sweep(base: Scenario, points: list[SweepPoint], *, jobs: int | None = None,
              progress: Callable[[], None] | None = None) -> list[PointOutcome]:
    with SweepRunner(min(jobs or available_cores(), len(points))) as runner:
        return runner.run(base, points, progress)
