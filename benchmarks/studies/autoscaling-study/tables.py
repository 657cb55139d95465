"""Read the autoscaling study's runs (run_study.sh: runs/NAME/summary.csv, requests.csv, timeline.csv, instances.csv)
into results.csv (a row per run), cold.csv (the hit rate of newly ready workers by time since they became ready, next
to the warm workers' at the same moments), cold_requests.csv (the hit rate of a new worker's 1st, 2nd, ... 20th
request, and when it came) and the study's figures in docs/figures/.

    .venv/bin/python benchmarks/studies/autoscaling-study/tables.py [--figures-only | --markdown]

Cold caches: a request is *cold* when it is sent to an instance that became ready after time 0 (a scale-out), and is
counted in the 10 s bin of its send time after that instance's ready time; the same bin's *warm* rate is the hit rate
of the requests sent at those moments to every other instance. An instance's requests are those sent to its slot
between its ready and drained times (instances.csv), so requests.csv's `worker` (a slot) is enough.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RUNS = HERE / "runs"
FIGURES = REPO / "docs" / "figures"
ROUTERS = ("random", "prefix-hash", "kv-aware", "kvsim")
FLEETS = ("fixed", "hpa", "planner")
BIN_S = 10.0
BINS = 18              # 3 minutes after a worker becomes ready
FIRST = 10             # a new worker's first requests
ORDINALS = 20          # the hit rate of a new worker's k-th request, k = 1..ORDINALS
RECOVERED = 0.9        # recovered: the new workers' hit rate is within 90 % of the warm workers' in the same bin
PRICE_L4_USD = 0.8048  # used only when a summary has no cost columns (AWS g6.xlarge list price, sim/timing/hardware.yaml)


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def num(row: dict[str, str], key: str) -> float:
    value = row.get(key, "")
    return float(value) if value not in ("", None) else math.nan


def split(name: str) -> tuple[str, str]:
    """`hpa-target2-kv-aware` -> (`hpa-target2`, `kv-aware`)."""
    for router in ROUTERS:
        if name.endswith("-" + router):
            return name[: -len(router) - 1], router
    raise ValueError(f"run {name!r}: no router of {ROUTERS} at its end")


def cold_bins(requests: list[dict[str, str]], instances: list[dict[str, str]]) -> dict[int, list[int]]:
    """Per bin after ready: [cold requests, cold hits, warm requests, warm hits, cold cached tokens, cold prompt
    tokens, warm cached tokens, warm prompt tokens] over every instance ready after time 0; bin -1: [requests,
    cached tokens, prompt tokens] of each new instance's first FIRST requests."""
    spans = defaultdict(list)  # slot -> [(ready_s, end_s, new)]
    for inst in instances:
        ready = num(inst, "ready_s")
        if math.isnan(ready):
            continue
        end = num(inst, "drained_s")
        spans[int(inst["slot"])].append((ready, math.inf if math.isnan(end) else end, ready > 0))
    new_ready = sorted(ready for s in spans.values() for ready, _, new in s if new)
    bins: dict[int, list[int]] = defaultdict(lambda: [0] * 8)
    measured = sorted((r for r in requests if r["warmup"] in ("False", "false", "0")), key=lambda r: float(r["sent_s"]))
    served: dict[tuple[int, float], int] = defaultdict(int)   # new instance -> requests sent to it so far
    first = [0, 0, 0]                                          # its first FIRST requests: count, cached, prompt tokens
    ordinal: dict[int, list] = defaultdict(lambda: [0, 0, 0, 0, []])  # k-th request: count, hits, cached, prompt, ages
    for r in measured:
        sent, slot = float(r["sent_s"]), int(r["worker"])
        hit = int(r["cached_tokens"]) > 0
        cached, prompt = int(r["cached_tokens"]), int(r["prompt_tokens"])
        own = next(((ready, new) for ready, end, new in spans[slot] if ready <= sent < end), None)
        if own is not None and own[1]:
            served[slot, own[0]] += 1
            k = served[slot, own[0]]
            if k <= ORDINALS:
                o = ordinal[k]
                o[0] += 1; o[1] += hit; o[2] += cached; o[3] += prompt; o[4].append(sent - own[0])
            if served[slot, own[0]] <= FIRST:
                first[0] += 1; first[1] += cached; first[2] += prompt
        if own is not None and own[1] and sent - own[0] < BIN_S * BINS:
            b = bins[int((sent - own[0]) // BIN_S)]
            b[0] += 1; b[1] += hit; b[4] += cached; b[5] += prompt
        # the warm side of every bin this moment falls in, for each new instance it is measured against
        for ready in new_ready:
            if 0 <= sent - ready < BIN_S * BINS and (own is None or not own[1] or own[0] != ready):
                b = bins[int((sent - ready) // BIN_S)]
                b[2] += 1; b[3] += hit; b[6] += cached; b[7] += prompt
    bins[-1] = first + [0] * 5
    return bins, ordinal


def summarise(name: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    run = RUNS / name
    s = read(run / "summary.csv")[0]
    fleet, router = split(name)
    requests = read(run / "requests.csv")
    measured = [r for r in requests if r["warmup"] in ("False", "false", "0")]
    if "gpu_hours" in s:
        gpu_hours, cost = num(s, "gpu_hours"), num(s, "cost_usd")
        per_m_tokens, per_m_slo = num(s, "usd_per_million_tokens"), num(s, "usd_per_million_slo_requests")
    else:  # before the cost columns: device-seconds of the fleet, or the fixed fleet over the measured phase
        if "fleet_device_s" in s:
            device_s = num(s, "fleet_device_s")
        else:
            span_s = max(float(r["finished_s"]) for r in measured) - min(float(r["sent_s"]) for r in measured)
            device_s = int(s["workers"]) * span_s
        gpu_hours = device_s / 3600
        cost = gpu_hours * PRICE_L4_USD
        tokens = sum(int(r["prompt_tokens"]) + int(r["output_tokens"]) for r in measured)
        per_m_tokens = cost / tokens * 1e6
        per_m_slo = cost / num(s, "slo_met_requests") * 1e6
    row: dict[str, object] = {
        "run": name, "fleet": fleet, "router": router, "requests": int(s["requests"]),
        "gpu_hours": gpu_hours, "cost_usd": cost, "usd_per_million_tokens": per_m_tokens,
        "usd_per_million_slo_requests": per_m_slo,
        "workers_mean": num(s, "fleet_workers_mean") if "fleet_workers_mean" in s else float(s["workers"]),
        "launched": int(num(s, "fleet_launched")) if "fleet_launched" in s else 0,
        "drained": int(num(s, "fleet_drained")) if "fleet_drained" in s else 0,
        "goodput_fraction": num(s, "goodput_fraction"), "request_hit_rate": num(s, "request_hit_rate"),
        "token_hit_rate": num(s, "token_hit_rate"), "ttft_p50_ms": num(s, "ttft_p50_ms"),
        "ttft_p99_ms": num(s, "ttft_p99_ms"),
    }
    cold_rows, ordinal_rows = [], []
    path = run / "instances.csv"
    if path.exists():
        bins, ordinal = cold_bins(requests, read(path))
        for b in range(BINS):
            c = bins[b]
            cold_rows.append({"run": name, "fleet": fleet, "router": router, "since_ready_s": b * BIN_S,
                              "cold_requests": c[0], "cold_request_hit_rate": c[1] / c[0] if c[0] else math.nan,
                              "cold_token_hit_rate": c[4] / c[5] if c[5] else math.nan,
                              "warm_requests": c[2], "warm_request_hit_rate": c[3] / c[2] if c[2] else math.nan,
                              "warm_token_hit_rate": c[6] / c[7] if c[7] else math.nan})
        row[f"cold_first{FIRST}_token_hit"] = bins[-1][1] / bins[-1][2] if bins[-1][2] else math.nan
        for k in range(1, ORDINALS + 1):
            o = ordinal[k]
            ages = sorted(o[4])
            ordinal_rows.append({"run": name, "fleet": fleet, "router": router, "kth_request": k, "instances": o[0],
                                 "request_hit_rate": o[1] / o[0] if o[0] else math.nan,
                                 "token_hit_rate": o[2] / o[3] if o[3] else math.nan,
                                 "median_since_ready_s": ages[len(ages) // 2] if ages else math.nan})
        first = cold_rows[:6]  # the first minute
        n = sum(r["cold_requests"] for r in first)
        row["cold_first_min_requests"] = n
        row["cold_first_min_token_hit"] = (sum(r["cold_token_hit_rate"] * r["cold_requests"] for r in first
                                               if r["cold_requests"]) / n) if n else math.nan
        recovered = next((r["since_ready_s"] for r in cold_rows if r["cold_requests"]
                          and r["cold_token_hit_rate"] >= RECOVERED * r["warm_token_hit_rate"]), math.nan)
        row["recovered_s"] = recovered
        # the fleet's own cold columns (timeline.csv: requests sent within cold_window_s = 60 s of their worker's
        # ready time, which includes the workers ready at time 0), for a cross-check of the first-minute figure
        timeline = [r for r in read(run / "timeline.csv") if num(r, "start_s") > 0]
        n = sum(num(r, "cold_requests") for r in timeline)
        row["timeline_cold_requests"] = int(n)
        row["timeline_cold_request_hit_rate"] = (sum(num(r, "cold_requests") * num(r, "cold_request_hit_rate")
                                                     for r in timeline if num(r, "cold_requests") > 0) / n
                                                 if n else math.nan)
    return row, cold_rows + ordinal_rows


def relative_to_fixed(rows: list[dict[str, object]]) -> None:
    fixed = {r["router"]: r for r in rows if r["fleet"] == "fixed"}
    for r in rows:
        base = fixed.get(r["router"])
        r["gpu_hours_vs_fixed"] = r["gpu_hours"] / base["gpu_hours"] if base else math.nan
        r["goodput_vs_fixed"] = r["goodput_fraction"] / base["goodput_fraction"] if base else math.nan


def write(path: Path, rows: list[dict[str, object]]) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, columns, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def _pooled(rows: list[dict[str, str]], value: str, weight: str) -> float:
    n = sum(float(r[weight]) for r in rows if r[value] not in ("", "nan") and float(r[weight]) > 0)
    return sum(float(r[value]) * float(r[weight]) for r in rows
               if r[value] not in ("", "nan") and float(r[weight]) > 0) / n if n else math.nan


def markdown() -> str:
    """The tables of docs/studies/autoscaling.md, from results.csv, cold.csv and cold_requests.csv."""
    rows, cold, ordinal = (read(HERE / name) for name in ("results.csv", "cold.csv", "cold_requests.csv"))
    out = ["| fleet | router | GPU-hours | cost $ | $ / M tokens | $ / M requests in SLO | goodput | request hit | "
           "token hit | TTFT p99 ms | workers (mean) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["fleet"], r["router"]): r for r in rows}
    for fleet in FLEETS:
        for router in ROUTERS:
            r = by[fleet, router]
            out.append(f"| {fleet} | {router} | {num(r, 'gpu_hours'):.2f} | {num(r, 'cost_usd'):.2f} | "
                       f"{num(r, 'usd_per_million_tokens'):.4f} | {num(r, 'usd_per_million_slo_requests'):.0f} | "
                       f"{num(r, 'goodput_fraction'):.4f} | {num(r, 'request_hit_rate'):.3f} | "
                       f"{num(r, 'token_hit_rate'):.3f} | {num(r, 'ttft_p99_ms'):,.0f} | {num(r, 'workers_mean'):.2f} |")
    out += ["", "| setting | router | GPU-hours (of fixed) | goodput (of fixed) | TTFT p99 ms | launched / drained | "
            "meets it |", "|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["fleet"] != "fixed"), key=lambda r: (r["fleet"], ROUTERS.index(r["router"]))):
        ok = num(r, "gpu_hours_vs_fixed") < 1 and num(r, "goodput_vs_fixed") >= 0.95
        out.append(f"| {r['fleet']} | {r['router']} | {num(r, 'gpu_hours'):.2f} ({num(r, 'gpu_hours_vs_fixed'):.3f}) | "
                   f"{num(r, 'goodput_fraction'):.4f} ({num(r, 'goodput_vs_fixed'):.4f}) | "
                   f"{num(r, 'ttft_p99_ms'):,.0f} | {r['launched']} / {r['drained']} | {'yes' if ok else '**no**'} |")
    out += ["", "| router | new workers | 1st request | 2nd-5th | 6th-20th | warm workers, same minutes | median time "
            "to the 5th request | new workers' first minute (token hit) | warm (token hit) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for router in ROUTERS:
        o = [r for r in ordinal if r["router"] == router]
        k = lambda lo, hi: [r for r in o if lo <= int(r["kth_request"]) <= hi]  # noqa: E731
        first_min = [r for r in cold if r["router"] == router and num(r, "since_ready_s") < 60]
        fifth = sorted(num(r, "median_since_ready_s") for r in k(5, 5) if not math.isnan(num(r, "median_since_ready_s")))
        out.append(f"| {router} | {sum(int(r['instances']) for r in k(1, 1))} | "
                   f"{_pooled(k(1, 1), 'request_hit_rate', 'instances'):.2f} | "
                   f"{_pooled(k(2, 5), 'request_hit_rate', 'instances'):.2f} | "
                   f"{_pooled(k(6, 20), 'request_hit_rate', 'instances'):.2f} | "
                   f"{_pooled(first_min, 'warm_request_hit_rate', 'warm_requests'):.2f} | "
                   f"{fifth[len(fifth) // 2]:.1f} s | {_pooled(first_min, 'cold_token_hit_rate', 'cold_requests'):.2f} | "
                   f"{_pooled(first_min, 'warm_token_hit_rate', 'warm_requests'):.2f} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures-only", action="store_true", help="draw from results.csv and cold.csv")
    parser.add_argument("--markdown", action="store_true", help="print the tables of docs/studies/autoscaling.md")
    args = parser.parse_args()
    if args.markdown:
        print(markdown())
        return
    if not args.figures_only:
        names = sorted(p.name for p in RUNS.iterdir() if (p / "summary.csv").exists())
        rows, cold = [], []
        for name in names:
            row, cold_rows = summarise(name)
            rows.append(row)
            cold += cold_rows
        relative_to_fixed(rows)
        write(HERE / "results.csv", rows)
        write(HERE / "cold.csv", [c for c in cold if "since_ready_s" in c])
        write(HERE / "cold_requests.csv", [c for c in cold if "kth_request" in c])
    import figures  # noqa: PLC0415 (matplotlib only when drawing)
    figures.draw(HERE, FIGURES)


if __name__ == "__main__":
    main()
