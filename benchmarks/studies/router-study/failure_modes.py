"""Where each router fails: the built-in workload (6 workers, N = 24, concurrency 8) made hard in one way at a time.

* `uniform`: the built-in workload as it is (every prefix equally popular);
* `skew`: Zipf popularity (exponent 1.0: the hottest prefix gets 27 % of the requests);
* `hot-prefix`: one prefix takes half the requests, the other 23 share the rest;
* `open-loop`: Poisson arrivals at 13 requests/s instead of a closed loop of 8 (random routing serves ~11.8/s at
  concurrency 8, KV-aware routing ~14): bursts queue on whichever worker the router favours.

Goodput counts requests with TTFT <= 150 ms and TPOT <= 20 ms. Every router sees the same request streams (repeat r uses seed r). Writes `failure_modes.csv` (one row per run, the
summary columns plus `mode`) beside this file and prints a Markdown table of means over repeats.

    .venv/bin/python benchmarks/studies/router-study/failure_modes.py [--repeats 3] [--jobs 2] [--routers a,b]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from policies import ROUTERS
from sim import load_scenario, run_sweep, sweep_points
from sim.results.report import SUMMARY_COLUMNS, csv_bytes, write_atomic

HERE = Path(__file__).resolve().parent

MODES = {
    "uniform": {},
    "skew": {"workload.popularity": "zipf", "workload.zipf_exponent": 1.0},
    "hot-prefix": {"workload.popularity": "weights", "workload.weights": [23.0] + [1.0] * 23},
    "open-loop": {"workload.arrival_rate_rps": 13.0},
}
SLO_TTFT_MS, SLO_TPOT_MS = 150.0, 20.0
"""The study's SLO (as docs/studies/router-study.md's): a TTFT a hit meets under load and a miss meets only when idle."""
SHOWN = ("request_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "goodput_rps", "max_worker_share", "jain_index")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--routers", default=",".join(sorted(n for n in ROUTERS if n != "recorded")))
    ap.add_argument("--out", type=Path, default=HERE / "failure_modes.csv")
    args = ap.parse_args()
    base, _ = load_scenario(None)
    routers = args.routers.split(",")
    rows = []
    t0 = time.perf_counter()
    for mode, overrides in MODES.items():
        scenario = base.with_overrides(**{"workload.prefixes": 24, "slo.ttft_ms": SLO_TTFT_MS,
                                          "slo.tpot_ms": SLO_TPOT_MS, **overrides})
        points = sweep_points(workers=[6], prefixes=[24], concurrency=[8], routers=routers, repeats=args.repeats,
                              seed=0)
        rows += [{"mode": mode, **o.row} for o in run_sweep(scenario, points, jobs=args.jobs)]
        print(f"{mode}: {len(points)} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    write_atomic(args.out, csv_bytes(rows, ("mode", *SUMMARY_COLUMNS)))
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["mode"], row["router"])].append(row)
    shown = [c for c in SHOWN if c in rows[0]]
    print("| mode | router | " + " | ".join(shown) + " |")
    print("|---|---|" + "---|" * len(shown))
    for mode in MODES:
        ranked = sorted((r for m, r in groups if m == mode),
                        key=lambda r: -statistics.fmean(float(x["request_hit_rate"]) for x in groups[(mode, r)]))
        for router in ranked:
            members = groups[(mode, router)]
            cells = [f"{statistics.fmean(float(m[c]) for m in members):.3g}" for c in shown]
            print(f"| {mode} | {router} | " + " | ".join(cells) + " |")
    print(f"wrote {args.out} ({len(rows)} runs, {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
