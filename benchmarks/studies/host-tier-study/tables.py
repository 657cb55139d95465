#!/usr/bin/env python3
"""The tables of docs/studies/host-tier-study.md from run_study.sh's CSVs (means and 95 % t-intervals over repeats).

    python benchmarks/studies/host-tier-study/tables.py                      # the tables (markdown)
    python benchmarks/studies/host-tier-study/tables.py --kv-aware-hit-rate  # kv-aware's mean hit rate at 0 GiB (a number)
    python benchmarks/studies/host-tier-study/tables.py --kv-aware-ttft-p99  # its mean TTFT p99 in ms
    python benchmarks/studies/host-tier-study/tables.py --figure study.png   # hit rate and TTFT vs host KV, per router
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLUMNS = ("request_hit_rate", "gpu_hit_rate", "cpu_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "ttft_gpu_hit_p50_ms",
           "ttft_cpu_hit_p50_ms", "ttft_miss_p50_ms", "throughput_rps", "goodput_fraction", "cpu_loaded_blocks",
           "cpu_evicted_blocks")


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open())) if path.exists() else []


def _mean_ci(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    if len(values) < 2:
        return values[0], float("nan")
    # t quantiles for 95 %, n - 1 = 1..9 degrees of freedom (the study runs 5 repeats)
    t = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)[min(len(values), 10) - 2]
    return statistics.fmean(values), t * statistics.stdev(values) / math.sqrt(len(values))


def points() -> dict[tuple[str, float], dict[str, tuple[float, float]]]:
    groups: dict[tuple[str, float], list[dict[str, str]]] = defaultdict(list)
    for r in _rows(HERE / "sweep" / "summary.csv") + _rows(HERE / "all-fit" / "summary.csv"):
        groups[(r["router"], float(r.get("cpu_kv_gib") or 0.0))].append(r)
    return {k: {c: _mean_ci([float(r[c]) for r in rs]) for c in COLUMNS} for k, rs in groups.items()}


def _fmt(pair: tuple[float, float], spec: str = ".3f") -> str:
    mean, ci = pair
    if math.isnan(mean):
        return "-"
    return f"{mean:{spec}}" + ("" if math.isnan(ci) else f" ± {ci:{spec}}")


def figure(path: Path) -> None:
    """Hit rate (left) and TTFT p50 / p99 (right) against host KV per worker, a line per router; the all-fit
    level dashed; means with 95 % intervals over the repeats."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = points()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, router in enumerate(("random", "kv-aware", "kvsim")):
        gibs = sorted(g for r, g in pts if r == router)
        for ax, col, style in ((left, "request_hit_rate", "o-"), (right, "ttft_p99_ms", "o-"),
                               (right, "ttft_p50_ms", "s:")):
            vals = [pts[(router, g)][col] for g in gibs]
            label = router if col != "ttft_p50_ms" else None
            ax.errorbar([g if g else 0.5 for g in gibs], [v[0] for v in vals],
                        yerr=[0 if math.isnan(v[1]) else v[1] for v in vals], fmt=style, color=f"C{i}", capsize=2,
                        ms=4, label=label)
    fit = pts.get(("random (all-fit GPU KV)", 0.0))
    if fit:
        left.axhline(fit["request_hit_rate"][0], color="grey", ls="--", label="random, all-fit GPU KV")
        right.axhline(fit["ttft_p99_ms"][0], color="grey", ls="--")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks([0.5, 4, 16, 64], ["0", "4", "16", "64"])
        ax.set_xlabel("host (CPU) KV per worker, GiB")
        ax.grid(alpha=0.3)
    left.set_ylabel("request hit rate")
    left.set_ylim(0, 1.05)
    left.legend(fontsize=8, loc="lower right")
    right.set_ylabel("TTFT ms (p99 solid, p50 dotted)")
    right.set_yscale("log")
    fig.suptitle("6 workers, N = 24, concurrency 8: host KV vs routing (5 runs per point, 95 % CI)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--figure":
        figure(Path(argv[2]))
        return 0
    pts = points()
    if argv[1:] == ["--kv-aware-hit-rate"]:
        print(f"{pts[('kv-aware', 0.0)]['request_hit_rate'][0]:.3f}")
        return 0
    if argv[1:] == ["--kv-aware-ttft-p99"]:
        print(f"{pts[('kv-aware', 0.0)]['ttft_p99_ms'][0]:.0f}")
        return 0
    print("| router | host KV GiB/worker | hit rate | of which CPU | TTFT p50 ms | TTFT p99 ms | p50 GPU hit / CPU hit / "
          "miss ms | goodput | req/s | CPU blocks loaded / evicted |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (router, gib), v in sorted(pts.items(), key=lambda kv: (kv[0][0] != "random", kv[0][0], kv[0][1])):
        print(f"| {router} | {gib:g} | {_fmt(v['request_hit_rate'])} | {_fmt(v['cpu_hit_rate'])} | "
              f"{_fmt(v['ttft_p50_ms'], '.0f')} | {_fmt(v['ttft_p99_ms'], '.0f')} | "
              f"{_fmt((v['ttft_gpu_hit_p50_ms'][0], math.nan), '.0f')} / "
              f"{_fmt((v['ttft_cpu_hit_p50_ms'][0], math.nan), '.0f')} / "
              f"{_fmt((v['ttft_miss_p50_ms'][0], math.nan), '.0f')} | {_fmt(v['goodput_fraction'])} | "
              f"{_fmt(v['throughput_rps'], '.1f')} | {v['cpu_loaded_blocks'][0]:.0f} / {v['cpu_evicted_blocks'][0]:.0f} |")
    for name in ("plan-hit-rate", "plan-ttft"):
        for r in _rows(HERE / name / "plan.csv"):
            print(f"\n{name}: router {r['router']}, {r['metric']} target {r['target']}: answer {r['answer'] or 'none'} "
                  f"{r['unit']} (predicted {r['predicted']}, analytic screen {r['analytic_answer'] or '-'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
