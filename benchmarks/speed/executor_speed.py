"""Wall time and peak memory of a sweep on each executor:
`python benchmarks/speed/executor_speed.py [--jobs 2] [--repeats 42]`.

The grid is prefixes 2,7,12,24 x workers 3,6 x concurrency 4,8,16 x 8 repeats (192 runs; 42 repeats: 1,008) of the
built-in scenario,
run with `LocalExecutor(jobs)` (a process pool) and with `DaskExecutor(jobs=jobs)` (a LocalCluster of `jobs`
single-threaded worker processes, its start and close included). Each executor runs in a fresh child interpreter,
so that the figures do not mix: peak RSS is `getrusage` of that interpreter (RUSAGE_SELF: the driver) and of its
waited-for descendants (RUSAGE_CHILDREN: the largest worker process). A benchmark, not a test: the machine is
shared and noisy, and the seconds are indicative only. Both executors must give the same rows (checked).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _one(kind: str, jobs: int, repeats: int) -> None:
    from sim.scenario import load_scenario
    from sim.studies.executor import open_executor
    from sim.studies.sweep import run_points, sweep_points

    scenario, _ = load_scenario()
    points = sweep_points(workers=[3, 6], prefixes=[2, 7, 12, 24], concurrency=[4, 8, 16],
                          routers=[scenario.router.name], repeats=repeats, seed=scenario.seed)
    t0 = time.perf_counter()
    with open_executor(kind, jobs=jobs) as executor:
        outcomes = run_points(executor, scenario, points)
    wall_s = time.perf_counter() - t0
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    digest = hashlib.sha256("\n".join(json.dumps(o.row, sort_keys=True) for o in outcomes).encode()).hexdigest()
    print(json.dumps({"kind": kind, "runs": len(points), "wall_s": wall_s, "self_mib": self_kib / 1024,
                      "children_mib": children_kib / 1024, "digest": digest}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=8, help="repeats of the 24-point grid (42: 1,008 runs)")
    parser.add_argument("--one", choices=["local", "dask"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args.one, args.jobs, args.repeats)
        return
    results = []
    for kind in ("local", "dask"):
        # NOTE: the checkout's `sim` first on the path, for the driver and the worker processes it starts.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        env_out = subprocess.run([sys.executable, __file__, "--one", kind, "--jobs", str(args.jobs),
                                  "--repeats", str(args.repeats)],
                                 capture_output=True, text=True, check=True, env=env)
        r = json.loads(env_out.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"{kind:5} --jobs {args.jobs}: {r['runs']} runs in {r['wall_s']:.1f} s "
              f"({r['runs'] / r['wall_s']:.1f} runs/s); peak RSS driver {r['self_mib']:.0f} MiB, "
              f"largest worker {r['children_mib']:.0f} MiB")
    print("same rows on both executors:", results[0]["digest"] == results[1]["digest"])


if __name__ == "__main__":
    main()
