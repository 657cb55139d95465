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
    "workers", "prefixes", "concurrency", "router", "engine", "repeat", "seed", "requests",
    "request_hit_rate", "full_hit_rate", "token_hit_rate",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "throughput_rps",
    "ttft_hit_p50_ms", "ttft_hit_p90_ms", "ttft_hit_p99_ms", "ttft_miss_p50_ms", "ttft_miss_p90_ms", "ttft_miss_p99_ms",
    "hit_requests", "full_hit_requests", "prefix_cache_queries", "prefix_cache_hits",
    "evicted_blocks", "evicted_tokens", "preemptions", "max_worker_share",
    "reuse_available", "reuse_captured", "reuse_delivered", "view_checked", "view_false_hit_rate", "view_false_tokens",
)

GROUP_KEYS = ("workers", "prefixes", "concurrency", "router", "engine")


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig, **layout) -> bytes:
    """The figure as PNG bytes (laid out tight, then closed)."""
    buf = io.BytesIO()
    fig.tight_layout(**layout)
    fig.savefig(buf, format="png")
    _pyplot().close(fig)
    return buf.getvalue()


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
    """Mean (and standard deviation) over repeats for each (workers, prefixes, concurrency, router, engine)."""
    groups: dict[tuple, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in GROUP_KEYS)].append(row)
    out = []
    for key, members in sorted(groups.items()):
        agg: dict[str, object] = dict(zip(GROUP_KEYS, key))
        agg["repeats"] = len(members)
        for col in ("request_hit_rate", "full_hit_rate", "token_hit_rate", "ttft_p50_ms", "ttft_p99_ms",
                    "throughput_rps", "preemptions", "max_worker_share", "reuse_available", "reuse_captured",
                    "reuse_delivered", "view_false_hit_rate"):
            values = [float(m[col]) for m in members if not math.isnan(float(m[col]))]
            agg[col] = statistics.fmean(values) if values else float("nan")
            agg[f"{col}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append(agg)
    return out


def _plot_formula(ax, capacity_requests: float, max_n: int, style: str) -> None:
    """The formula min(1, C/N) as a curve over N in [1, max_n]."""
    grid = [1 + i * (max_n - 1) / 200 for i in range(201)]
    ax.plot(grid, [min(1.0, capacity_requests / n) for n in grid], style, lw=1,
            label=f"formula min(1, {capacity_requests:.2f}/N)")


def hit_rate_figure(
    aggregated: Sequence[dict[str, object]], *, capacity_requests: float,
    measured: dict[tuple[int, int, int], float], title: str,
) -> bytes:
    """Request hit rate vs N: a line per (workers, router), the formula min(1, C/N), the measured points."""
    plt = _pyplot()
    lines: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    engines = {row.get("engine") for row in aggregated}
    for row in aggregated:
        lines[(row["workers"], row["router"], row.get("engine"))][int(row["prefixes"])].append(
            float(row["request_hit_rate"]))
    all_n = sorted({int(r["prefixes"]) for r in aggregated} | {n for (_, n, _) in measured})
    # NOTE: the legend sits right of the axes, never over the data; past 10 lines, 20 colours and a marker per
    # ten keep every line distinct (a router comparison can have 15).
    fig, ax = plt.subplots(figsize=(8 + 3 * (len(lines) > 4), 5), dpi=110)
    colours = plt.get_cmap("tab10" if len(lines) <= 10 else "tab20").colors
    for i, ((workers, router, engine), by_n) in enumerate(sorted(lines.items(), key=lambda kv: tuple(map(str, kv[0])))):
        ns = sorted(by_n)
        on = f" on {engine}" if len(engines) > 1 else ""
        ax.plot(ns, [statistics.fmean(by_n[n]) for n in ns], marker="osD^v"[i // len(colours) % 5],
                color=colours[i % len(colours)], label=f"kvsim {router}{on}, {workers} workers")
    if all_n:
        _plot_formula(ax, capacity_requests, max(all_n), "k--")
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
    if len(lines) > 4:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        fig.tight_layout()
    else:
        ax.legend(fontsize=8)
    return _png(fig)


def ttft_cdf_figure(outcomes: Sequence, *, title: str) -> bytes:
    """TTFT CDFs: a panel per (workers, router, engine) x concurrency, a colour per N, hits solid and misses
    dashed (repeats pooled)."""
    plt = _pyplot()
    pooled: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: {"hit": [], "miss": []})
    for o in outcomes:
        p = o.point
        key = ((p.workers, p.router, o.row.get("engine", "")), p.concurrency, p.prefixes)
        pooled[key]["hit"] += o.ttft.hit_ms
        pooled[key]["miss"] += o.ttft.miss_ms
    groups = sorted({k[0] for k in pooled})
    concurrencies = sorted({k[1] for k in pooled})
    prefixes = sorted({k[2] for k in pooled})
    several_engines = len({g[2] for g in groups}) > 1
    colours = {n: plt.cm.viridis(i / max(1, len(prefixes) - 1)) for i, n in enumerate(prefixes)}
    fig, axes = plt.subplots(len(groups), len(concurrencies), squeeze=False, sharex=True, sharey=True,
                             figsize=(4.2 * len(concurrencies), 3.2 * len(groups)), dpi=100)
    for gi, group in enumerate(groups):
        workers, router, engine = group
        for ci, conc in enumerate(concurrencies):
            ax = axes[gi][ci]
            for n in prefixes:
                samples = pooled.get((group, conc, n))
                if samples is None:
                    continue
                for split, style in (("hit", "-"), ("miss", "--")):
                    values = sorted(samples[split])
                    if values:
                        ys = [(i + 1) / len(values) for i in range(len(values))]
                        ax.step(values, ys, style, where="post", color=colours[n], lw=1.2,
                                label=f"N={n} {split}" if gi == 0 and ci == 0 else None)
            ax.set_xscale("log")
            on = f", {engine}" if several_engines else ""
            ax.set_title(f"{workers} workers, {router}{on}, C={conc}", fontsize=9)
            ax.grid(alpha=0.3)
            if gi == len(groups) - 1:
                ax.set_xlabel("TTFT (ms)")
            if ci == 0:
                ax.set_ylabel("fraction of requests")
    fig.legend(loc="upper right", fontsize=7, ncol=2)
    fig.suptitle(title)
    return _png(fig, rect=(0, 0, 0.88, 0.96))


def engine_figure(aggregated: Sequence[dict[str, object]], *, capacity_requests: float,
                  measured: dict[tuple[int, int, int], float], measured_engine: str, title: str) -> bytes:
    """Engines side by side: a panel per worker count; per engine the request hit rate (solid, +-1 sd over repeats)
    and the full-hit rate (dashed; the gap between them is partial hits), the formula and the measured points."""
    plt = _pyplot()
    workers = sorted({int(r["workers"]) for r in aggregated})
    engines = sorted({str(r["engine"]) for r in aggregated})
    fig, axes = plt.subplots(1, len(workers), squeeze=False, sharey=True, figsize=(5.2 * len(workers), 4.2), dpi=100)
    all_n = sorted({int(r["prefixes"]) for r in aggregated} | {n for (_, n, _) in measured})
    for ax, w in zip(axes[0], workers):
        for i, engine in enumerate(engines):
            rows = sorted((r for r in aggregated if int(r["workers"]) == w and r["engine"] == engine),
                          key=lambda r: int(r["prefixes"]))
            ns = [int(r["prefixes"]) for r in rows]
            ax.errorbar(ns, [float(r["request_hit_rate"]) for r in rows],
                        yerr=[float(r["request_hit_rate_sd"]) for r in rows], marker="o", color=f"C{i}", capsize=3,
                        label=f"{engine}: request hit rate")
            ax.plot(ns, [float(r["full_hit_rate"]) for r in rows], "--", marker=".", color=f"C{i}",
                    label=f"{engine}: full hits only")
        _plot_formula(ax, capacity_requests, max(all_n), "k:")
        pts = sorted((n, v) for (mw, n, _c), v in measured.items() if mw == w)
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="x", s=50, color="black", zorder=5,
                       label=f"measured ({measured_engine})")
        ax.set_title(f"{w} workers", fontsize=10)
        ax.set_xlabel("distinct prefixes N")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of measured requests")
    handles, labels = axes[0][0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (labels[i].startswith(("formula", "measured")), labels[i]))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="center right", fontsize=8)
    fig.suptitle(title)
    return _png(fig, rect=(0, 0, 0.78, 0.95))


def plan_figure(plans: Sequence, *, target_hit_rate: float | None, target_ttft_p99_ms: float | None,
                unit: str, title: str) -> bytes:
    """The target metric(s) vs the varied quantity: simulated means with 95 % intervals (solid), the analytic
    screen (dashed), one colour per router, the target as a horizontal line."""
    plt = _pyplot()
    panels = [p for p in ("hit", "ttft") if (p == "hit" and target_hit_rate is not None)
              or (p == "ttft" and target_ttft_p99_ms is not None)]
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(6.5 * len(panels), 4.5), dpi=100)
    for ax, panel in zip(axes[0], panels):
        for i, p in enumerate(plans):
            colour = f"C{i}"
            xs = [e.value for e in p.evaluations]
            if panel == "hit":
                ys = [e.hit_rate for e in p.evaluations]
                err = [0 if e.hit_rate_ci95 != e.hit_rate_ci95 else e.hit_rate_ci95 for e in p.evaluations]
                if p.analytic_curve:
                    ax.plot([v for v, _ in p.analytic_curve], [h for _, h in p.analytic_curve], "--", color=colour,
                            lw=1, label=f"{p.router}: analytic screen")
            else:
                ys = [e.ttft_p99 for e in p.evaluations]
                err = [0 if e.ttft_p99_ci95 != e.ttft_p99_ci95 else e.ttft_p99_ci95 for e in p.evaluations]
            ax.errorbar(xs, ys, yerr=err, fmt="o-", color=colour, capsize=3, label=f"{p.router}: simulated")
            if p.answer is not None:
                ax.axvline(p.answer, color=colour, alpha=0.3, lw=6)
        target = target_hit_rate if panel == "hit" else target_ttft_p99_ms
        ax.axhline(target, color="black", lw=1, label="target")
        ax.set_xlabel(unit)
        ax.set_ylabel("request hit rate" if panel == "hit" else "TTFT p99 (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return _png(fig)


def replay_figure(stats, *, title: str) -> bytes:
    """Prefix reuse and request hit rate, and TTFT p50/p99, per time bin of the trace (by send time)."""
    plt = _pyplot()
    keys = sorted(stats.bins)
    minutes = [k * stats.bin_s / 60 for k in keys]
    bins = [stats.bins[k] for k in keys]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), dpi=100)
    top.plot(minutes, [b.cached_tokens / b.prompt_tokens if b.prompt_tokens else float("nan") for b in bins],
             label="prefix reuse (cached / prompt tokens)")
    top.set_ylabel("reuse")
    top.set_ylim(0, 1)
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    bottom.plot(minutes, [b.ttft_ms.percentile(50) for b in bins], label="TTFT p50")
    bottom.plot(minutes, [b.ttft_ms.percentile(99) for b in bins], label="TTFT p99")
    bottom.set_yscale("log")
    bottom.set_ylabel("TTFT (ms)")
    bottom.set_xlabel("trace time (min)")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8)
    fig.suptitle(title)
    return _png(fig)


def column_label(column: str) -> str:
    """An axis label for a summary column, with its unit (`ttft_p99_ms` -> "TTFT p99 (ms)")."""
    known = {"request_hit_rate": "request hit rate (fraction of requests)",
             "full_hit_rate": "full-hit rate (fraction of requests)",
             "token_hit_rate": "token hit rate (fraction of prompt tokens)",
             "throughput_rps": "throughput (requests/s)", "workers": "workers", "kv-gib": "KV cache per worker (GiB)"}
    if column in known:
        return known[column]
    if column.startswith("ttft_") and column.endswith("_ms"):
        return "TTFT " + column.removeprefix("ttft_").removesuffix("_ms").replace("_", " ") + " (ms)"
    for suffix, unit in (("_ms", "ms"), ("_rps", "requests/s"), ("_s", "s"), ("_rate", "fraction"),
                         ("_fraction", "fraction"), ("_share", "fraction")):
        if column.endswith(suffix):
            return f"{column} ({unit})"
    return column


def tune_figure(result, *, title: str) -> bytes:
    """`kvsim tune`'s trials in the plane of its two Pareto metrics: every trial (feasible filled, infeasible
    crosses), the front as a staircase with 95 % intervals, the default and the best marked, and the constraints
    on either metric as lines. One question: what does each setting cost in the other metric?"""
    from sim.studies.search_space import format_value

    plt = _pyplot()
    mx, my = result.pareto
    nan = float("nan")

    def xy(trials):
        return ([t.means.get(mx.column, nan) for t in trials], [t.means.get(my.column, nan) for t in trials])

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    feasible = [t for t in result.trials if t.feasible]
    infeasible = [t for t in result.trials if not t.feasible]
    if feasible:
        ax.scatter(*xy(feasible), s=22, color="C0", alpha=0.6, label=f"feasible trial ({len(feasible)})")
    if infeasible:
        ax.scatter(*xy(infeasible), s=22, marker="x", color="0.55", label=f"infeasible trial ({len(infeasible)})")
    front = sorted(result.front, key=lambda t: t.means[mx.column])
    if front:
        xs, ys = xy(front)
        # NOTE: the staircase bounds what the front dominates: with x to maximise, a front point covers the x
        # below it (where="pre"); with x to minimise, the x above it (where="post").
        ax.step(xs, ys, where="pre" if mx.maximize else "post", color="C2", lw=1.5, label=f"Pareto front ({len(front)})")
        err = [[0.0 if math.isnan(t.ci95.get(c, nan)) else t.ci95[c] for t in front] for c in (mx.column, my.column)]
        ax.errorbar(xs, ys, xerr=err[0], yerr=err[1], fmt="o", color="C2", ms=5, capsize=2, lw=1)
    base = result.baseline
    ax.scatter(*xy([base]), s=90, marker="D", color="C1", edgecolor="black", zorder=5,
               label=f"default (trial 0): {base.router}")
    answer = result.answer
    ax.scatter(*xy([answer]), s=260, marker="*", color="C3", edgecolor="black", zorder=6,
               label=f"{'best' if result.best is not None else 'closest (infeasible)'} (trial {answer.number})\n"
                     + "\n".join(f"  {k}={format_value(v)}" for k, v in answer.params.items()))
    for c in result.constraints:
        if c.column == mx.column:
            ax.axvline(c.bound, color="black", ls="--", lw=1, label=f"constraint {c.text()}")
        elif c.column == my.column:
            ax.axhline(c.bound, color="black", ls="--", lw=1, label=f"constraint {c.text()}")
    others = [c.text() for c in result.constraints if c.column not in (mx.column, my.column)]
    ax.set_xlabel(column_label(mx.column) + (", higher is better" if mx.maximize else ", lower is better"))
    ax.set_ylabel(column_label(my.column) + (", higher is better" if my.maximize else ", lower is better"))
    ax.grid(alpha=0.3)
    ax.set_title(title + (f"\nalso constrained: {', '.join(others)}" if others else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig)


def choose_router_figure(choice, *, title: str) -> bytes:
    """`kvsim plan --choose-router`: every router's trials in the plane of the two Pareto metrics, a colour per
    router (its trials faint, its default a diamond, its answer a large marker with 95 % intervals), the
    constraints on either metric as lines."""
    from sim.studies.search_space import format_value

    plt = _pyplot()
    mx, my = choice.results[0].pareto
    nan = float("nan")
    fig, ax = plt.subplots(figsize=(10, 6), dpi=100)

    def xy(t):
        return t.means.get(mx.column, nan), t.means.get(my.column, nan)

    for i, result in enumerate(choice.results):
        colour = f"C{i % 10}"
        pts = [xy(t) for t in result.trials]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, color=colour, alpha=0.3)
        ax.scatter(*xy(result.baseline), s=50, marker="D", color=colour, alpha=0.7, edgecolor="black", lw=0.5)
        t = result.answer
        x, y = xy(t)
        ci = [0.0 if math.isnan(v) else v for v in (t.ci95.get(mx.column, nan), t.ci95.get(my.column, nan))]
        mark = " (answer)" if i == choice.best else "" if t.feasible else " (infeasible)"
        settings = "".join(f"\n  {k}={format_value(v)}" for k, v in t.params.items()) if not t.is_baseline else (
            "\n  defaults" if t.params else "")
        ax.errorbar([x], [y], xerr=[ci[0]], yerr=[ci[1]], fmt="*" if i == choice.best else "o",
                    ms=16 if i == choice.best else 9, color=colour, mec="black", capsize=3, zorder=5,
                    label=f"{result.router}{mark}{settings}")
    ax.scatter([], [], s=50, marker="D", color="white", edgecolor="black", label="each router's default")
    ax.scatter([], [], s=10, color="0.5", alpha=0.4, label="each router's trials")
    for c in choice.results[0].constraints:
        if c.column == mx.column:
            ax.axvline(c.bound, color="black", ls="--", lw=1, label=f"constraint {c.text()}")
        elif c.column == my.column:
            ax.axhline(c.bound, color="black", ls="--", lw=1, label=f"constraint {c.text()}")
    ax.set_xlabel(column_label(mx.column) + (", higher is better" if mx.maximize else ", lower is better"))
    ax.set_ylabel(column_label(my.column) + (", higher is better" if my.maximize else ", lower is better"))
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _png(fig)
