"""The figures of sweeps, plans and replays (PNG bytes; the CLI writes them): small multiples with intervals, the
measured points beside the predictions, legends outside the data."""

from __future__ import annotations

import io
import math
import textwrap
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from sim.results.stats import percentile


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


def _finite(value: object) -> float:
    """A float, with nan (a single run's interval, a missing value) as 0 for error bars."""
    v = float(value) if value is not None else math.nan
    return 0.0 if math.isnan(v) else v


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


def with_host_tier(router: str, row: dict[str, object], several_tiers: bool) -> str:
    """A series' router label, with its host (CPU) KV tier when the rows have several ("random +16 GiB CPU KV")."""
    gib = float(row.get("cpu_kv_gib", 0.0) or 0.0)
    return f"{router} +{gib:g} GiB CPU KV" if several_tiers else router


def _several_tiers(rows: Sequence[dict[str, object]]) -> bool:
    return len({float(r.get("cpu_kv_gib", 0.0) or 0.0) for r in rows}) > 1


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
    tiers = _several_tiers(aggregated)
    series = sorted({(with_host_tier(str(r["router"]), r, tiers), str(r.get("engine"))) for r in aggregated})
    all_n = sorted({int(r["prefixes"]) for r in aggregated}
                   | {n for (w, n, c) in measured if w in workers and c in concurrencies})
    repeats = max((int(r.get("repeats", 1)) for r in aggregated), default=1)
    legend_rows = math.ceil((len(series) + 2) / min(3, 2 * len(workers) - 1))
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
                               and with_host_tier(str(r["router"]), r, tiers) == router
                               and str(r.get("engine")) == engine),
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
    # NOTE: one column of panels is too narrow for three legend entries abreast.
    fig.legend([labels[lab] for lab in order], order, loc="lower center", ncol=min(3, 2 * len(workers) - 1),
               fontsize=8, frameon=False)
    interval = f"mean ± 95% CI (t) over {repeats} runs" if repeats > 1 else "1 run per point: no interval"
    text = f"{title} ({interval})" + ("" if shown_measured else "; no measurement at these points")
    # NOTE: wrapped to the figure's width (about 11 characters per inch at this size): one panel is narrow.
    fig.suptitle(textwrap.fill(text, width=max(40, int(11 * fig.get_figwidth()))), fontsize=11)
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
    tiers = _several_tiers([o.row for o in outcomes])
    for o in outcomes:
        p = o.point
        router = with_host_tier(p.router, o.row, tiers)
        key = ((router, str(o.row.get("engine", "")), p.concurrency), p.workers, p.prefixes)
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
                            ax.scatter([percentile(every, 100 * q) for _, q in got], [q for _, q in got],
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
    top.plot(minutes, [b.prefix_reuse for b in bins], label="prefix reuse (cached / prompt tokens)")
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


