"""Turning sweep rows into what people read: an aggregated table, `summary.csv` and `hit_rate.png`.

Only the CLI calls the writers; every file is written atomically (a temporary file renamed into place).
"""

from __future__ import annotations

import csv
import io
import math
import os
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

SUMMARY_COLUMNS = (
    "workers", "prefixes", "concurrency", "router", "repeat", "seed", "requests",
    "request_hit_rate", "full_hit_rate", "token_hit_rate",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "throughput_rps",
    "ttft_hit_p50_ms", "ttft_hit_p90_ms", "ttft_hit_p99_ms", "ttft_miss_p50_ms", "ttft_miss_p90_ms", "ttft_miss_p99_ms",
    "hit_requests", "full_hit_requests", "prefix_cache_queries", "prefix_cache_hits",
    "evicted_blocks", "preemptions", "max_worker_share",
)

GROUP_KEYS = ("workers", "prefixes", "concurrency", "router")


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def csv_bytes(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue().encode()


def aggregate(rows: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """Mean (and standard deviation) over repeats for each (workers, prefixes, concurrency, router)."""
    groups: dict[tuple, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in GROUP_KEYS)].append(row)
    out = []
    for key, members in sorted(groups.items()):
        agg: dict[str, object] = dict(zip(GROUP_KEYS, key))
        agg["repeats"] = len(members)
        for col in ("request_hit_rate", "full_hit_rate", "token_hit_rate", "ttft_p50_ms", "ttft_p99_ms",
                    "throughput_rps", "preemptions", "max_worker_share"):
            values = [float(m[col]) for m in members if not math.isnan(float(m[col]))]
            agg[col] = statistics.fmean(values) if values else float("nan")
            agg[f"{col}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append(agg)
    return out


def hit_rate_figure(
    aggregated: Sequence[dict[str, object]], *, capacity_requests: float,
    measured: dict[tuple[int, int, int], float], title: str,
) -> bytes:
    """Request hit rate vs N: a line per (workers, router), the formula min(1, C/N), the measured points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    lines: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in aggregated:
        lines[(row["workers"], row["router"])][int(row["prefixes"])].append(float(row["request_hit_rate"]))
    all_n = sorted({int(r["prefixes"]) for r in aggregated} | {n for (_, n, _) in measured})
    for (workers, router), by_n in sorted(lines.items()):
        ns = sorted(by_n)
        ax.plot(ns, [statistics.fmean(by_n[n]) for n in ns], marker="o", label=f"kvsim {router}, {workers} workers")
    if all_n:
        grid = [1 + i * (max(all_n) - 1) / 200 for i in range(201)]
        ax.plot(grid, [min(1.0, capacity_requests / n) for n in grid], "k--", lw=1,
                label=f"formula min(1, {capacity_requests:.2f}/N)")
    by_workers: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (workers, n, _c), value in measured.items():
        by_workers[workers].append((n, value))
    for marker, (workers, pts) in zip("xs^v", sorted(by_workers.items())):
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=50, zorder=5,
                   color="black", label=f"measured, {workers} workers")
    ax.set_xlabel("distinct prefixes N")
    ax.set_ylabel("request hit rate")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
