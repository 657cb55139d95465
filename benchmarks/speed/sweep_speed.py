"""How long the reference sweep takes: `python benchmarks/speed/sweep_speed.py [--repeats R] [--jobs J]`.

Times the reference grid, the README's first command (prefixes 2,7,12,24 x workers 3,6 x concurrency 4,8,16 x R repeats) on the
built-in scenario, in one process and in parallel, and prints wall seconds, runs/s and the parallel speed-up
(a ratio measured in one run: the machine is shared and noisy, absolute seconds are indicative only).
"""

from __future__ import annotations

import argparse
import os
import time

from sim.scenario import load_scenario
from sim.studies.sweep import run_sweep, sweep_points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    scenario, _ = load_scenario()
    points = sweep_points(workers=[3, 6], prefixes=[2, 7, 12, 24], concurrency=[4, 8, 16],
                          routers=[scenario.router.name], repeats=args.repeats, seed=scenario.seed)
    timings = {}
    for jobs in sorted({1, args.jobs}):
        t0 = time.perf_counter()
        rows = [o.row for o in run_sweep(scenario, points, jobs=jobs)]
        timings[jobs] = time.perf_counter() - t0
        requests = sum(int(r["requests"]) for r in rows)
        print(f"jobs={jobs}: {len(points)} runs, {requests} measured requests in {timings[jobs]:.2f} s "
              f"= {len(points) / timings[jobs]:.1f} runs/s, {requests / timings[jobs]:.0f} requests/s")
    if len(timings) > 1:
        print(f"parallel speed-up with {args.jobs} jobs: {timings[1] / timings[args.jobs]:.2f}x")


if __name__ == "__main__":
    main()
