"""The autoscaling study's figures (docs/studies/autoscaling.md), one question each, drawn from results.csv, cold.csv
and the runs' timeline.csv files (tables.py calls `draw`)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROUTERS = ("random", "prefix-hash", "kv-aware", "kvsim")
FLEETS = ("fixed", "hpa", "planner")
COLOURS = {"fixed": "#7f7f7f", "hpa": "#1f77b4", "planner": "#d62728"}
LABELS = {"fixed": "fixed peak fleet (7)", "hpa": "HPA", "planner": "Planner"}


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _num(value: str) -> float:
    return float(value) if value not in ("", None) else math.nan


def cost_and_goodput(results: list[dict[str, str]], out: Path) -> None:
    """What does each fleet cost, and what does it deliver? A panel per router: GPU-hours per fleet (bars), with the
    goodput fraction written on each bar."""
    fig, axes = plt.subplots(1, len(ROUTERS), figsize=(11, 3.2), sharey=True)
    by = {(r["fleet"], r["router"]): r for r in results}
    for ax, router in zip(axes, ROUTERS):
        for i, fleet in enumerate(FLEETS):
            r = by.get((fleet, router))
            if r is None:
                continue
            hours = _num(r["gpu_hours"])
            ax.bar(i, hours, color=COLOURS[fleet])
            ax.text(i, hours + 0.2, f"{_num(r['goodput_fraction']):.3f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(FLEETS)), [LABELS[f].split(" (")[0] for f in FLEETS], fontsize=8)
        ax.set_title(router, fontsize=10)
        ax.set_ylim(0, 16.5)
    axes[0].set_ylabel("GPU-hours (L4) for the day")
    fig.suptitle("GPU-hours per fleet and router; the number on a bar is its goodput fraction (TTFT <= 500 ms)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def day(runs: Path, out: Path, router: str = "kvsim") -> None:
    """How does each fleet follow the day? A panel per fleet: load (req/s, right axis) and workers ready over time."""
    fig, axes = plt.subplots(1, len(FLEETS), figsize=(11, 3.0), sharey=True)
    for ax, fleet in zip(axes, FLEETS):
        path = runs / f"{fleet}-{router}" / "timeline.csv"
        ax.set_title(LABELS[fleet], fontsize=10)
        load = ax.twinx()
        load.set_ylim(0, 18)
        if fleet == "fixed" or not path.exists():
            ax.axhline(7, color=COLOURS["fixed"], lw=2)
            other = runs / f"hpa-{router}" / "timeline.csv"
            rows = _read(other) if other.exists() else []
        else:
            rows = _read(path)
            t = [_num(r["start_s"]) / 3600 for r in rows]
            ax.step(t, [_num(r["workers_ready"]) for r in rows], where="post", color=COLOURS[fleet], lw=2,
                    label="workers ready")
        t = [_num(r["start_s"]) / 3600 for r in rows]
        load.plot(t, [_num(r["arrivals_rps"]) for r in rows], color="black", lw=0.6, alpha=0.5)
        if fleet == FLEETS[-1]:
            load.set_ylabel("arrivals (req/s, grey)")
        else:
            load.set_yticklabels([])
        ax.set_xlabel("time (h of the compressed day)")
        ax.set_ylim(0, 8)
    axes[0].set_ylabel("L4 workers ready")
    fig.suptitle(f"Workers over the day ({router} routing): 2 h = one 24 h diurnal period", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def cold(ordinal: list[dict[str, str]], bins: list[dict[str, str]], out: Path) -> None:
    """How fast does a new worker's cache warm? A panel per router: the request hit rate of a new worker's 1st, 2nd,
    ... 20th request, pooled over every autoscaled run with that router, against the warm workers' hit rate at the
    same moments (their first minute, dashed)."""
    fig, axes = plt.subplots(1, len(ROUTERS), figsize=(11, 3.2), sharey=True)
    for ax, router in zip(axes, ROUTERS):
        rows = [r for r in ordinal if r["router"] == router]
        ks = sorted({int(r["kth_request"]) for r in rows})
        hits, counts = [], []
        for k in ks:
            at = [r for r in rows if int(r["kth_request"]) == k and _num(r["instances"]) > 0]
            n = sum(_num(r["instances"]) for r in at)
            counts.append(n)
            hits.append(sum(_num(r["request_hit_rate"]) * _num(r["instances"]) for r in at) / n if n else math.nan)
        ax.plot(ks, hits, color="#1f77b4", marker="o", ms=3, label="new worker's k-th request")
        warm = [r for r in bins if r["router"] == router and _num(r["since_ready_s"]) < 60 and _num(r["warm_requests"])]
        n = sum(_num(r["warm_requests"]) for r in warm)
        if n:
            level = sum(_num(r["warm_request_hit_rate"]) * _num(r["warm_requests"]) for r in warm) / n
            ax.axhline(level, color="black", ls="--", lw=1, label="warm workers, same minutes")
        ax.set_title(f"{router} ({int(counts[0]) if counts else 0} new workers)", fontsize=10)
        ax.set_xlabel("k-th request of a new worker")
        ax.set_ylim(0, 1)
        ax.set_xticks([1, 5, 10, 15, 20])
    axes[0].set_ylabel("request hit rate")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Cold caches after a scale-out: a new worker's first requests, every autoscaled run pooled", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw(study: Path, figures: Path) -> None:
    results = _read(study / "results.csv")
    cost_and_goodput([r for r in results if r["fleet"] in FLEETS], figures / "autoscaling-cost.png")
    day(study / "runs", figures / "autoscaling-day.png")
    cold(_read(study / "cold_requests.csv"), _read(study / "cold.csv"), figures / "autoscaling-cold.png")
