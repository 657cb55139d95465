"""A grid of runs over workers x prefixes x concurrency x router x repeat, run in parallel processes."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from sim.runner import run
from sim.scenario import Scenario
from sim.summary import summarize


@dataclass(frozen=True, slots=True)
class SweepPoint:
    workers: int
    prefixes: int
    concurrency: int
    router: str
    repeat: int
    seed: int

    def scenario(self, base: Scenario) -> Scenario:
        return base.with_overrides(**{
            "cluster.workers": self.workers,
            "workload.prefixes": self.prefixes,
            "workload.concurrency": self.concurrency,
            "router.name": self.router,
            "router.options": base.router.options if self.router == base.router.name else {},
            "seed": self.seed,
        })


def sweep_points(
    *, workers: Iterable[int], prefixes: Iterable[int], concurrency: Iterable[int], routers: Iterable[str],
    repeats: int, seed: int,
) -> list[SweepPoint]:
    """Every combination; repeat r runs with seed + r (so repeat 0 of every point shares the base seed)."""
    return [
        SweepPoint(w, n, c, r, k, seed + k)
        for w, n, c, r, k in itertools.product(workers, prefixes, concurrency, routers, range(repeats))
    ]


def run_point(base: Scenario, point: SweepPoint) -> dict[str, object]:
    summary = summarize(run(point.scenario(base)))
    return {
        "workers": point.workers, "prefixes": point.prefixes, "concurrency": point.concurrency,
        "router": point.router, "repeat": point.repeat, "seed": point.seed, **summary.row(),
    }


def _run_star(args: tuple[Scenario, SweepPoint]) -> dict[str, object]:
    return run_point(*args)


def run_sweep(
    base: Scenario, points: list[SweepPoint], *, jobs: int | None = None,
    progress: Callable[[], None] | None = None,
) -> list[dict[str, object]]:
    """One summary row per point, in the order of `points`. `jobs` processes (default: all cores)."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(points)))
    for point in points:
        point.scenario(base)  # validate every point before spending time on any
    if jobs == 1:
        rows = []
        for point in points:
            rows.append(run_point(base, point))
            if progress:
                progress()
        return rows
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        rows = []
        for row in pool.map(_run_star, [(base, p) for p in points], chunksize=max(1, len(points) // (jobs * 8))):
            rows.append(row)
            if progress:
                progress()
        return rows
