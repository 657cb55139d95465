"""The session study (issue 24): on the shipped chat and agent scenarios, which router wins, what share of the reuse
available each captures, what a host KV tier buys across think times and tool gaps, and what session affinity costs
in balance.

    python benchmarks/studies/session-study/study.py [--repeats 3] [--jobs 2] [--out benchmarks/studies/session-study]

Every (scenario, router, host tier, repeat) is one `kvsim run` of the scenario with that router (repeat r: seed r, so
every router sees the same sessions), on the scenario's engine, workers and KV. Prints one table per scenario (mean
± 95 % t-interval over the repeats) and writes results.csv (a row per run). Takes ~10 min on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from sim.results.stats import t_interval  # noqa: E402
from sim.results.summary import summarize  # noqa: E402
from sim.routing.spec import router_overrides  # noqa: E402
from sim.runner import run  # noqa: E402
from sim.scenario import load_scenario, with_cpu_kv_gib  # noqa: E402

ROUTERS = ("random", "round-robin", "kv-aware", "vllm-router-session", "kv-aware:session_affinity_ttl_s=300",
           "kv-aware:session_affinity_ttl_s=300,session_affinity_mode=soft", "llm-d", "kvsim")
SCENARIOS = ("chat", "agent")
HOST_GIB = (0.0, 32.0)
COLUMNS = ("token_hit_rate", "reuse_available", "reuse_captured", "context_hit_rate", "gap_survival",
           "gpu_gap_survival", "ttft_p50_ms", "ttft_p99_ms", "session_time_p50_s", "max_worker_share", "jain_index",
           "throughput_rps")


def one(args: tuple[str, str, float, int]) -> dict:
    name, router, host_gib, repeat = args
    base, _ = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    scenario = with_cpu_kv_gib(base, host_gib).with_overrides(
        **{**router_overrides(router, base.router.name, base.router.options), "seed": base.seed + repeat})
    row = summarize(run(scenario)).row()
    return {"scenario": name, "router": router, "cpu_kv_gib": host_gib, "repeat": repeat,
            **{c: row.get(c, float("nan")) for c in COLUMNS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--routers", default=";".join(ROUTERS), help="Routers, ';'-separated.")
    args = parser.parse_args()
    todo = [(s, r, g, k) for s in args.scenarios.split(",") for r in args.routers.split(";")
            for g in HOST_GIB for k in range(args.repeats)]
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        rows = pool.map(one, todo, chunksize=1)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    shown = ("token_hit_rate", "reuse_captured", "gap_survival", "gpu_gap_survival", "ttft_p50_ms", "ttft_p99_ms",
             "max_worker_share", "jain_index")
    for name in args.scenarios.split(","):
        print(f"\n{name} (mean ± 95% CI over {args.repeats} repeats; reuse available "
              f"{mean([r['reuse_available'] for r in rows if r['scenario'] == name]):.3f})")
        print(f"{'router':58s} {'host':>5s} " + " ".join(f"{c:>17s}" for c in shown))
        for router in args.routers.split(";"):
            for gib in HOST_GIB:
                sel = [r for r in rows if r["scenario"] == name and r["router"] == router and r["cpu_kv_gib"] == gib]
                cells = []
                for c in shown:
                    ci = t_interval([float(r[c]) for r in sel])
                    m, h = ci.mean, ci.half_width
                    cells.append(f"{m:>9.3f} ± {h:<5.3f}" if c not in ("ttft_p50_ms", "ttft_p99_ms") else
                                 f"{m:>9.0f} ± {h:<5.0f}")
                print(f"{router:58s} {gib:>5.0f} " + " ".join(cells))


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


if __name__ == "__main__":
    main()
