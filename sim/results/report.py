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

import numpy as np

from sim.results.intervals import t_interval

SUMMARY_COLUMNS = (
    "workers", "prefixes", "concurrency", "router", "engine", "repeat", "seed", "requests",
    "request_hit_rate", "full_hit_rate", "token_hit_rate",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "throughput_rps",
    "ttft_hit_p50_ms", "ttft_hit_p90_ms", "ttft_hit_p99_ms", "ttft_miss_p50_ms", "ttft_miss_p90_ms", "ttft_miss_p99_ms",
    "hit_requests", "full_hit_requests", "prefix_cache_queries", "prefix_cache_hits",
    "evicted_blocks", "evicted_tokens", "preemptions", "max_worker_share",
    "reuse_available", "reuse_captured", "reuse_delivered", "view_checked", "view_false_hit_rate", "view_false_tokens",
    "slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms", "slo_met_requests", "goodput_rps", "goodput_fraction",
    "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "imbalance_max_mean", "jain_index",
    "ttft_slo_met", "tpot_slo_met", "e2e_slo_met",
)

AGGREGATED_COLUMNS = (
    "request_hit_rate", "full_hit_rate", "token_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "throughput_rps",
    "preemptions", "max_worker_share", "reuse_available", "reuse_captured", "reuse_delivered", "view_false_hit_rate",
    "goodput_rps", "goodput_fraction", "tpot_p50_ms", "tpot_p99_ms", "e2e_p99_ms", "imbalance_max_mean", "jain_index",
)
"""The summary columns `aggregate` averages over repeats (each with `_sd` and `_ci95`)."""

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
    """Mean, standard deviation (`_sd`) and 95 % t-interval half-width (`_ci95`, nan for one run) over repeats for
    each (workers, prefixes, concurrency, router, engine)."""
    groups: dict[tuple, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in GROUP_KEYS)].append(row)
    out = []
    for key, members in sorted(groups.items()):
        agg: dict[str, object] = dict(zip(GROUP_KEYS, key))
        agg["repeats"] = len(members)
        for col in AGGREGATED_COLUMNS:
            values = [float(m[col]) for m in members if not math.isnan(float(m[col]))]
            agg[col] = statistics.fmean(values) if values else float("nan")
            agg[f"{col}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
            agg[f"{col}_ci95"] = t_interval(values).half_width
        out.append(agg)
    return out


def _grid(plt, nrows: int, ncols: int, *, panel_w: float, panel_h: float, legend_w: float = 0.0,
          legend_h: float = 0.0, **kw):
    """A figure of nrows x ncols panels with room for a legend beside (right, `legend_w` in) or below
    (`legend_h` in) them; returns (fig, axes, rect for tight_layout)."""
    w, h = panel_w * ncols + legend_w, panel_h * nrows + legend_h + 0.7
    fig, axes = plt.subplots(nrows, ncols, squeeze=False, figsize=(w, h), dpi=100, **kw)
    return fig, axes, (0, legend_h / h, 1 - legend_w / w, 1 - 0.35 / h)


def _dodge(i: int, k: int, width: float) -> float:
    """The offset of series i of k side by side around a shared x (total spread `width`)."""
    return 0.0 if k <= 1 else (i - (k - 1) / 2) * width / (k - 1)


def _plot_formula(ax, capacity_requests: float, max_n: int, style: str) -> None:
    """The formula min(1, C/N) as a curve over N in [1, max_n]."""
    grid = [1 + i * (max_n - 1) / 200 for i in range(201)]
    ax.plot(grid, [min(1.0, capacity_requests / n) for n in grid], style, lw=1,
            label=f"formula min(1, C/N), C = {capacity_requests:.2f} prompts per worker")


def hit_rate_figure(
    aggregated: Sequence[dict[str, object]], *, capacity_requests: float,
    measured: dict[tuple[int, int, int], float], title: str, measured_label: str = "measured",
) -> bytes:
    """Request hit rate vs N as small multiples: a panel per worker count (columns) and concurrency (rows). In a
    panel, a line per router (and engine, if several): the mean over repeats with its 95 % t-interval as error
    bars; the formula min(1, C/N); the measured points of exactly that (workers, concurrency) as black crosses
    beside the predictions (series side by side around each N). One legend below the panels."""
    plt = _pyplot()
    workers = sorted({int(r["workers"]) for r in aggregated})
    concurrencies = sorted({int(r["concurrency"]) for r in aggregated})
    several_engines = len({r.get("engine") for r in aggregated}) > 1
    series = sorted({(str(r["router"]), str(r.get("engine"))) for r in aggregated})
    all_n = sorted({int(r["prefixes"]) for r in aggregated}
                   | {n for (w, n, c) in measured if w in workers and c in concurrencies})
    repeats = max((int(r.get("repeats", 1)) for r in aggregated), default=1)
    legend_rows = math.ceil((len(series) + 2) / 3)
    fig, axes, rect = _grid(plt, len(concurrencies), len(workers), panel_w=4.6, panel_h=3.5,
                            legend_h=0.3 + 0.22 * legend_rows, sharex=True, sharey=True)
    colours = plt.get_cmap("tab10" if len(series) <= 10 else "tab20").colors
    spread = 0.05 * (max(all_n) - min(all_n)) if len(all_n) > 1 else 0.4
    shown_measured = False
    for ri, conc in enumerate(concurrencies):
        for ci, w in enumerate(workers):
            ax = axes[ri][ci]
            pts = sorted((n, v) for (mw, n, mc), v in measured.items() if mw == w and mc == conc)
            k = len(series) + bool(pts)
            for i, (router, engine) in enumerate(series):
                rows = sorted((r for r in aggregated if int(r["workers"]) == w and int(r["concurrency"]) == conc
                               and str(r["router"]) == router and str(r.get("engine")) == engine),
                              key=lambda r: int(r["prefixes"]))
                if not rows:
                    continue
                xs = [int(r["prefixes"]) + _dodge(i, k, spread) for r in rows]
                err = [_finite(r.get("request_hit_rate_ci95")) for r in rows]
                on = f" on {engine}" if several_engines else ""
                ax.errorbar(xs, [float(r["request_hit_rate"]) for r in rows], yerr=err, marker="osD^v"[i // 10 % 5],
                            ms=4, color=colours[i % len(colours)], capsize=2.5, lw=1.2, label=f"kvsim {router}{on}")
            if all_n:
                _plot_formula(ax, capacity_requests, max(all_n), "k--")
            if pts:
                shown_measured = True
                ax.scatter([n + _dodge(k - 1, k, spread) for n, _ in pts], [v for _, v in pts], marker="x", s=40,
                           lw=1.5, color="black", zorder=5, label=measured_label)
            ax.set_title(f"{w} workers, concurrency {conc}", fontsize=10)
            ax.set_ylim(0, 1.05)
            ax.grid(alpha=0.3)
            if ri == len(concurrencies) - 1:
                ax.set_xlabel("distinct prefixes N")
            if ci == 0:
                ax.set_ylabel("request hit rate (fraction)")
    labels = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            labels.setdefault(lab, h)
    order = sorted(labels, key=lambda lab: (lab.startswith("formula"), lab == measured_label, lab))
    fig.legend([labels[lab] for lab in order], order, loc="lower center", ncol=3, fontsize=8, frameon=False)
    interval = f"mean ± 95% CI (t) over {repeats} runs" if repeats > 1 else "1 run per point: no interval"
    fig.suptitle(f"{title} ({interval})" + ("" if shown_measured else "; no measurement at these points"),
                 fontsize=11)
    return _png(fig, rect=rect)


_TTFT_MEASURED = {
    "hit": (("ttft_hit_p50", 0.50), ("ttft_hit_p90", 0.90)),
    "miss": (("ttft_miss_p50", 0.50), ("ttft_miss_p90", 0.90)),
    "all": (("ttft_p50", 0.50), ("ttft_p99", 0.99)),
}
"""Measured TTFT percentiles drawn on the CDFs: the reference metric and its quantile, per curve."""
_TTFT_STYLE = {"hit": ("-", "o"), "miss": ("--", "s"), "all": (None, "D")}
"""Per split: the line style of the simulated CDF (none for all requests) and the marker of the measured
percentiles."""
_TTFT_MAX_ROWS = 8
"""More panel rows than this ((router, engine) groups x concurrencies) would make a figure of unreadable height:
then only one group is drawn."""


def ttft_panel_rows(keys: Sequence[tuple[str, str, int]],
                    measured_group: tuple[str, str] | None) -> tuple[list[tuple[str, str, int]], str]:
    """The rows of `ttft_cdf_figure` among (router, engine, concurrency) keys, router by router, and the note its
    title carries: every key when they fit in `_TTFT_MAX_ROWS`, else only `measured_group`'s (or the first
    group's), with a note saying so."""
    groups = sorted({k[:2] for k in keys})
    concurrencies = sorted({k[2] for k in keys})
    note = ""
    if len(groups) * len(concurrencies) > _TTFT_MAX_ROWS:
        keep = measured_group if measured_group in groups else groups[0]
        note = f" — {keep[0]} only ({len(groups)} routers or engines ran; all are in summary.csv)"
        groups = [keep]
    return sorted({k for k in keys if k[:2] in groups}), note


def ttft_cdf_figure(outcomes: Sequence, *, title: str,
                    measured: dict[tuple[int, int, int], dict[str, float]] | None = None,
                    measured_group: tuple[str, str] | None = None) -> bytes:
    """TTFT CDFs as small multiples, on the grid of `hit_rate_figure`: a column per worker count, a row per
    concurrency (and per router and engine when several ran, router by router); in a panel a colour per N, hits
    solid, misses dashed (repeats pooled), on a logit quantile axis so that p90 and p99 read as well as the median.

    `measured[(workers, N, concurrency)]` holds reference percentiles in ms (`ttft_hit_p50`, ..., `ttft_p99`):
    drawn as black-edged markers at (ms, quantile) on the panels of `measured_group` (the router and engine the
    reference ran), beside the simulated curve they belong to; the percentiles of all requests, which have no
    curve, beside kvsim's as hollow markers. When (router, engine) groups x concurrencies pass `_TTFT_MAX_ROWS`,
    only `measured_group` (or the first group) is drawn, and the title says so. One legend right of the panels."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    measured = measured or {}
    pooled: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: {"hit": [], "miss": []})
    for o in outcomes:
        p = o.point
        key = ((p.router, str(o.row.get("engine", "")), p.concurrency), p.workers, p.prefixes)
        pooled[key]["hit"] += o.ttft.hit_ms
        pooled[key]["miss"] += o.ttft.miss_ms
    rows, note = ttft_panel_rows([k[0] for k in pooled], measured_group)
    groups = sorted({r[:2] for r in rows})
    workers_list = sorted({k[1] for k in pooled})
    prefixes = sorted({k[2] for k in pooled})
    several_engines = len({g[1] for g in groups}) > 1
    colours = {n: plt.cm.viridis(0.9 * i / max(1, len(prefixes) - 1)) for i, n in enumerate(prefixes)}
    fig, axes, rect = _grid(plt, len(rows), len(workers_list), panel_w=4.4, panel_h=3.3, legend_w=2.4,
                            sharex=True, sharey=True)
    any_measured = False
    for ri, (router, engine, conc) in enumerate(rows):
        for ci, workers in enumerate(workers_list):
            ax = axes[ri][ci]
            for n in prefixes:
                samples = pooled.get(((router, engine, conc), workers, n))
                if samples is None:
                    continue
                for split in ("hit", "miss"):
                    values = sorted(samples[split])
                    if values:
                        # NOTE: Hazen plotting positions (i + 0.5) / n keep every point off 0 and 1 on the logit axis.
                        ys = [(i + 0.5) / len(values) for i in range(len(values))]
                        ax.step(values, ys, _TTFT_STYLE[split][0], where="post", color=colours[n], lw=1.3)
                ref = measured.get((workers, n, conc), {}) if (router, engine) == measured_group else {}
                for split, marks in _TTFT_MEASURED.items():
                    got = [(ref[m], q) for m, q in marks if m in ref]
                    if not got:
                        continue
                    any_measured = True
                    ax.scatter([g[0] for g in got], [g[1] for g in got], marker=_TTFT_STYLE[split][1], s=32,
                               color=colours[n], edgecolors="black", linewidths=0.9, zorder=6)
                    if split == "all":
                        # NOTE: all requests have no curve of their own (it would double the lines): kvsim's
                        # percentiles of them are hollow markers beside the measured ones.
                        every = np.sort(np.asarray(samples["hit"] + samples["miss"]))
                        if every.size:
                            ax.scatter([float(np.percentile(every, 100 * q)) for _, q in got], [q for _, q in got],
                                       marker=_TTFT_STYLE[split][1], s=60, facecolors="none",
                                       edgecolors=colours[n], linewidths=1.3, zorder=7)
            ax.set_xscale("log")
            ax.set_yscale("logit")
            ax.set_ylim(0.005, 0.998)
            ax.set_yticks([0.01, 0.1, 0.5, 0.9, 0.99])
            ax.set_yticklabels(["0.01", "0.1", "0.5", "0.9", "0.99"])
            ax.minorticks_off()
            ax.yaxis.set_minor_locator(plt.NullLocator())
            on = f" on {engine}" if several_engines else ""
            ax.set_title(f"{router}{on}, {workers} workers, concurrency {conc}", fontsize=9)
            ax.grid(alpha=0.3)
            if ri == len(rows) - 1:
                ax.set_xlabel("TTFT (ms)")
            if ci == 0:
                ax.set_ylabel("fraction of requests ≤ TTFT")
    handles = [Line2D([], [], color=colours[n], lw=2, label=f"N = {n} prefixes") for n in prefixes]
    handles += [Line2D([], [], color="0.3", ls=_TTFT_STYLE[s][0], lw=1.3, label=f"kvsim, {lab}")
                for s, lab in (("hit", "hits"), ("miss", "misses"))]
    if any_measured:
        handles += [Line2D([], [], color="0.7", marker=_TTFT_STYLE[s][1], markeredgecolor="black", lw=0,
                           label=f"measured {lab}") for s, lab in (("hit", "hits p50, p90"),
                                                                   ("miss", "misses p50, p90"),
                                                                   ("all", "all requests p50, p99"))]
        handles.append(Line2D([], [], color="none", marker=_TTFT_STYLE["all"][1], markeredgecolor="0.3", lw=0,
                              label="kvsim, all requests p50, p99"))
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle(f"{title}{note}", fontsize=11)
    return _png(fig, rect=rect)


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
    # NOTE: below the panels, never over the data (a legend at the right covered the last panel).
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    fig.suptitle(title)
    legend_h = 0.25 + 0.2 * math.ceil(len(order) / 3)
    return _png(fig, rect=(0, legend_h / 4.2, 1, 0.95))


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


# --- router comparisons (`kvsim compare`) ---------------------------------------------------------------------------

_POINT_KEYS = ("workers", "prefixes", "concurrency")
_FRONT_COLOUR = "C3"
_OTHER_COLOUR = "0.35"


def _by_point(aggregated: Sequence[dict[str, object]]) -> list[tuple[tuple, list[dict[str, object]]]]:
    """Aggregated compare rows grouped by (workers, prefixes, concurrency), in their order."""
    points: dict[tuple, list[dict[str, object]]] = {}
    for agg in aggregated:
        points.setdefault(tuple(agg.get(k) for k in _POINT_KEYS), []).append(agg)
    return list(points.items())


def _point_grid(points: Sequence[tuple]) -> tuple[int, int, list[tuple[int, int]]]:
    """Where each (workers, prefixes, concurrency) point's panel goes: a row per worker count and a column per
    (prefixes, concurrency) when that makes at most 4 columns (the grid a sweep reads in; with a single column,
    the worker counts side by side instead), else three panels a row in order. Returns (rows, columns, the (row, column) of each point)."""
    workers = sorted({p[0] for p in points})
    columns = sorted({p[1:] for p in points}, key=lambda pc: tuple(-1 if v is None else v for v in pc))
    if len(columns) == 1 and len(workers) <= 4:  # one (N, concurrency) or a trace: worker counts side by side
        return 1, len(workers), [(0, workers.index(p[0])) for p in points]
    if len(columns) <= 4 and len(workers) * len(columns) <= 12:
        return len(workers), len(columns), [(workers.index(p[0]), columns.index(p[1:])) for p in points]
    ncols = min(3, len(points))
    return math.ceil(len(points) / ncols), ncols, [divmod(i, ncols) for i in range(len(points))]


def _hide_unused(axes, cells: Sequence[tuple[int, int]]) -> None:
    used = set(cells)
    for r, row in enumerate(axes):
        for c, ax in enumerate(row):
            if (r, c) not in used:
                ax.set_visible(False)


def _wrapped(title: str, fig) -> str:
    """`title` broken into lines that fit the figure's width (about 11 characters per inch at 11 points)."""
    import textwrap

    return "\n".join(textwrap.wrap(title, width=max(40, int(fig.get_figwidth() * 11))))


def _point_title(point: tuple) -> str:
    workers, prefixes, concurrency = point
    if prefixes is None:
        return f"{workers} workers"
    return f"{workers} workers, N = {prefixes} prefixes, concurrency {concurrency}"


def _finite(value: object) -> float:
    """A float, with nan (a single run's interval, a missing value) as 0 for error bars."""
    v = float(value) if value is not None else math.nan
    return 0.0 if math.isnan(v) else v


def _bound_labels(agg: dict[str, object], capacity_requests: float | None) -> tuple[str, str | None]:
    """The text of the bound line and of the random expectation line (None for a trace), on two lines each."""
    if capacity_requests is None:
        return f"bound: reuse available = {float(agg['bound']):.3f}\n(one infinite cache shared by all)", None
    w, n, c = agg["workers"], agg["prefixes"], capacity_requests
    return (f"bound min(1, W·C/N)\n= min(1, {w}·{c:.2f}/{n}) = {float(agg['bound']):.3f}",
            f"random routing min(1, C/N)\n= min(1, {c:.2f}/{n}) = {float(agg['random_expectation']):.3f}")


def _bound_lines(ax, agg: dict[str, object], capacity_requests: float | None, *, horizontal: bool) -> None:
    """The bound (dashed) and random routing's expectation (dotted) across the axes, labelled in the margin beside
    the line's end (never over the data): the bound's label above its level, the expectation's below, so that the
    two never cover each other when they meet (at min(1, ...) = 1)."""
    bound_text, random_text = _bound_labels(agg, capacity_requests)
    lines = [(float(agg["bound"]), bound_text, "--", "bottom")]
    if random_text is not None:
        lines.append((float(agg["random_expectation"]), random_text, ":", "top"))
    for value, text, style, side in lines:
        if math.isnan(value):
            continue
        if horizontal:
            ax.axhline(value, color="black", ls=style, lw=1, zorder=1)
            ax.annotate(text, (1, value), xycoords=ax.get_yaxis_transform(), xytext=(4, 0),
                        textcoords="offset points", ha="left", va=side, fontsize=7, annotation_clip=False)
        else:
            ax.axvline(value, color="black", ls=style, lw=1, zorder=1)
            ax.annotate(text, (value, 1), xycoords=ax.get_xaxis_transform(), xytext=(0, 3),
                        textcoords="offset points", ha="left" if side == "bottom" else "right", va="bottom",
                        fontsize=7, annotation_clip=False)


def _primary_label(capacity_requests: float | None) -> str:
    return ("prefix reuse (cached / prompt tokens)" if capacity_requests is None
            else "request hit rate (fraction of requests)")


def _overlap(a, b) -> float:
    """Area (pixels²) of the intersection of two display-space boxes."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _place_labels(ax, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str], colours: Sequence[str], *,
                  obstacles: Sequence = (), fontsize: float = 7) -> None:
    """Label each point next to it, greedily: for each point (in the order given), the nearest of rings of
    candidate offsets whose text box overlaps the least (weighted: other labels and texts 4, points 3, error bars
    1) and stays inside the axes. A label moved beyond the first ring gets a thin leader line."""
    from matplotlib.transforms import Bbox

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    centres = ax.transData.transform(list(zip(xs, ys)))
    weighted = [(t.get_window_extent(renderer), 4.0) for t in obstacles]
    weighted += [(Bbox.from_bounds(px - 4, py - 4, 8, 8), 3.0) for px, py in centres]
    for line in ax.lines + [c for c in ax.collections]:
        try:
            weighted.append((line.get_window_extent(renderer), 0.02))  # error bars: large thin boxes, weak weight
        except (AttributeError, RuntimeError):
            pass
    angles = (0, 25, -25, 180, 155, -155, 60, -60, 120, -120, 90, -90)
    rings = (6, 14, 24, 36, 50)
    for x, y, label, colour in zip(xs, ys, labels, colours):
        best = None
        for ring, radius in enumerate(rings):
            for angle in angles:
                dx, dy = radius * math.cos(math.radians(angle)), radius * math.sin(math.radians(angle))
                ha = "left" if dx > 1 else "right" if dx < -1 else "center"
                va = "bottom" if dy > 1 else "top" if dy < -1 else "center"
                probe = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                    fontsize=fontsize)
                box = probe.get_window_extent(renderer)
                probe.remove()
                outside = (box.x0 < inside.x0) or (box.x1 > inside.x1) or (box.y0 < inside.y0) or (box.y1 > inside.y1)
                # NOTE: each ring further out costs as much as a small overlap, so that a label stays beside its
                # point unless that covers something.
                score = (sum(w * _overlap(box, b) for b, w in weighted) + 60.0 * ring
                         + (1e9 if outside else 0.0))
                if best is None or score < best[0]:
                    best = (score, ring, dx, dy, ha, va, box)
            if best[0] <= 60.0 * ring:
                break
        _, ring, dx, dy, ha, va, box = best
        ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=fontsize,
                    color=colour, arrowprops=dict(arrowstyle="-", lw=0.7, color=colour, shrinkA=0, shrinkB=3)
                    if ring > 0 else None)
        weighted.append((box, 4.0))


def compare_figure(aggregated: Sequence[dict[str, object]], *, capacity_requests: float | None, title: str) -> bytes:
    """Hit rate against TTFT p99, a panel per (workers, N, concurrency): each router a labelled point with its 95 %
    intervals in both directions, the Pareto frontier (highest hit rate for a TTFT p99) as a step line through
    its routers (red), the bound as a dashed line and random routing's expectation min(1, C/N) as a dotted one.
    For a trace, prefix reuse instead of the hit rate and the reuse available as the bound."""
    plt = _pyplot()
    points = _by_point(aggregated)
    nrows, ncols, cells = _point_grid([p for p, _ in points])
    width, height = (8.0, 6.0) if len(points) == 1 else (6.6, 5.2)
    fig, axes = plt.subplots(nrows, ncols, squeeze=False, figsize=(width * ncols, height * nrows + 0.9), dpi=110)
    _hide_unused(axes, cells)
    labels = []
    for cell, (point, block) in zip(cells, points):
        ax = axes[cell]
        primary = str(block[0]["primary_metric"])
        xs = [float(a["ttft_p99_ms"]) for a in block]
        ys = [float(a[primary]) for a in block]
        xerr = [_finite(a.get("ttft_p99_ms_ci95")) for a in block]
        yerr = [_finite(a.get(f"{primary}_ci95")) for a in block]
        colours = [_FRONT_COLOUR if a["on_front"] else _OTHER_COLOUR for a in block]
        for x, y, ex, ey, colour, a in zip(xs, ys, xerr, yerr, colours, block):
            # NOTE: faint bars, solid points: the labels and their leader lines must stay readable across bars.
            ax.errorbar([x], [y], xerr=[ex], yerr=[ey], fmt="none", ecolor=colour, elinewidth=0.8, capsize=2,
                        alpha=0.45, zorder=3)
            ax.plot([x], [y], "o", ms=5.5 if a["on_front"] else 4.5, color=colour, zorder=4)
        front = sorted((x, y) for x, y, a in zip(xs, ys, block) if a["on_front"])
        if front:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color=_FRONT_COLOUR, lw=1.2,
                    alpha=0.6, zorder=2)
        _bound_lines(ax, block[0], capacity_requests, horizontal=True)
        finite_x = [x for x in xs if not math.isnan(x)] or [1.0]
        lo = min(x - e for x, e in zip(xs, xerr) if not math.isnan(x)) if xs else 0
        hi = max(x + e for x, e in zip(xs, xerr) if not math.isnan(x)) if xs else max(finite_x)
        span = max(hi - lo, 1e-9)
        ax.set_xlim(max(0.0, lo - 0.12 * span), hi + 0.25 * span)
        ax.set_ylim(0, _fraction_top([_finite(block[0]["bound"]), *(_finite(y) + e for y, e in zip(ys, yerr))]))
        ax.set_xlabel("TTFT p99 (ms)")
        ax.set_ylabel(_primary_label(capacity_requests))
        ax.set_title(_point_title(point), fontsize=10)
        ax.grid(alpha=0.3)
        order = sorted(range(len(block)), key=lambda i: (not block[i]["on_front"], -_finite(ys[i])))
        labels.append((ax, [xs[i] for i in order], [ys[i] for i in order], [str(block[i]["router"]) for i in order],
                       [colours[i] for i in order]))
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=_FRONT_COLOUR, marker="o", lw=1.2, label="Pareto frontier"),
        Line2D([], [], color=_OTHER_COLOUR, marker="o", lw=0, label="dominated: another router hits more at a "
                                                                    "lower TTFT p99"),
        Line2D([], [], color="black", marker="|", lw=0.8, label="bars: 95% CI over repeats"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3 if ncols > 1 else 1, fontsize=8, frameon=False)
    fig.suptitle(_wrapped(title, fig), fontsize=11)
    rect = (0, 0.75 / (height * nrows + 0.9), 1, 0.98)
    # NOTE: labels are placed in display space, so the layout is fixed first (the labels stay inside the axes and
    # do not move it again).
    fig.tight_layout(rect=rect)
    fig.canvas.draw()
    for ax, *job in labels:
        _place_labels(ax, *job)
    return _png(fig, rect=rect)


def _fraction_end(values: Sequence[float]) -> float:
    """Where a fraction axis's data ends: 1 when the values reach past one half (the whole range reads as a share),
    else 15 % above the largest (a trace's reuse of a few per cent must not sit flat on the axis)."""
    top = max([0.0, *values])
    return 1.0 if top > 0.5 else max(1.15 * top, 0.01)


def _fraction_top(values: Sequence[float]) -> float:
    """The top of a fraction axis: a little headroom above `_fraction_end` on a full 0..1 axis."""
    end = _fraction_end(values)
    return 1.08 if end == 1.0 else end


def compare_bars_figure(aggregated: Sequence[dict[str, object]], *, capacity_requests: float | None,
                        title: str) -> bytes:
    """The hit rate per router, highest at the top, as bars with 95 % intervals, a panel per point; the bound
    (dashed) and random routing's expectation (dotted); each bar labelled with its fraction of the bound."""
    plt = _pyplot()
    points = _by_point(aggregated)
    nrows, ncols, cells = _point_grid([p for p, _ in points])
    height = max(2.5, 0.32 * max(len(b) for _, b in points) + 1.4)
    fig, axes = plt.subplots(nrows, ncols, squeeze=False, figsize=(7.0 * ncols, height * nrows + 0.5), dpi=110)
    _hide_unused(axes, cells)
    for cell, (point, block) in zip(cells, points):
        ax = axes[cell]
        primary = str(block[0]["primary_metric"])
        rows = list(reversed(block))  # barh draws bottom up: the best router at the top
        ys = range(len(rows))
        values = [_finite(a[primary]) for a in rows]
        ax.barh(list(ys), values, xerr=[_finite(a.get(f"{primary}_ci95")) for a in rows], height=0.65,
                color=[_FRONT_COLOUR if a["on_front"] else "0.6" for a in rows], error_kw=dict(lw=0.8, capsize=2))
        ax.set_yticks(list(ys), [str(a["router"]) for a in rows], fontsize=8)
        end = _fraction_end([_finite(block[0]["bound"]),
                             *(v + _finite(a.get(f"{primary}_ci95")) for v, a in zip(values, rows))])
        # NOTE: the values as a column right of the bars, past the end of the data, where no bar or line reaches.
        for y, v, a in zip(ys, values, rows):
            frac = float(a["fraction_of_bound"])
            half = float(a.get(f"{primary}_ci95", math.nan))
            ax.text(1.03 * end, y, f"{v:.3f}" + ("" if math.isnan(half) else f" ± {half:.3f}")
                    + ("" if math.isnan(frac) else f"  {100 * frac:.0f}% of bound"), va="center", fontsize=7)
        _bound_lines(ax, block[0], capacity_requests, horizontal=False)
        ax.set_xlim(0, end)
        ticks = [t for t in ax.get_xticks() if 0 <= t <= end * 1.001]
        ax.set_xlim(0, 1.8 * end)  # room for the column of values inside the axes
        ax.set_xticks(ticks)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_xlabel(_primary_label(capacity_requests))
        ax.set_title(_point_title(point), fontsize=10, pad=26)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(_wrapped(title, fig) + "\nred: on the Pareto frontier of hit rate and TTFT p99 (kvsim compare's ★)",
                 fontsize=10)
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
