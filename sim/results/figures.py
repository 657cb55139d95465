"""The figures of sweeps, plans and replays: small multiples with intervals, the measured points beside the
predictions, legends outside the data, units on every axis.

Each figure has a `draw_*` function that returns the laid-out matplotlib Figure (what the tests inspect) and a
`*_figure` function that returns its PNG bytes (what the CLI writes). Drawing is deterministic: the same rows give
the same artists."""

from __future__ import annotations

import functools
import io
import math
import textwrap
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from sim.results.stats import percentile, t_interval


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    """The laid-out figure as PNG bytes (then closed)."""
    import matplotlib
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    # NOTE: `fig.tight_layout()` lays the figure out once and leaves a placeholder layout engine behind, for which
    # savefig draws the whole figure once more without rendering it ("to make sure [a layout engine] works") before
    # it renders it: a placeholder does no layout, so that draw changes nothing (the same bytes) and cost a third of
    # the save. Without an engine (unless the rc settings ask for one), savefig draws once.
    if (isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine) and not matplotlib.rcParams["figure.autolayout"]
            and not matplotlib.rcParams["figure.constrained_layout.use"]):
        fig.set_layout_engine(None)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    _pyplot().close(fig)
    return buf.getvalue()


def as_png(draw: Callable) -> Callable[..., bytes]:
    """The `*_figure` function of a `draw_*` one: the same arguments, the figure's PNG bytes."""

    @functools.wraps(draw)
    def figure(*args, **kwargs) -> bytes:
        return _png(draw(*args, **kwargs))

    return figure


def _finite(value: object) -> float:
    """A float, with nan (a single run's interval, a missing value) as 0 for error bars."""
    v = float(value) if value is not None else math.nan
    return 0.0 if math.isnan(v) else v


def clipped_err(values: Sequence[float], halves: Sequence[float | None], *, lo: float = 0.0,
                hi: float = math.inf) -> list[list[float]]:
    """matplotlib's (below, above) error bar lengths of the intervals value ± half, clipped to [lo, hi]: where the
    quantity ends (a TTFT or a rate at 0, a fraction at 1) or where the axis does. With 2 to 5 runs a t-interval
    can reach past them. A NaN half-width (one run) or value draws no bar."""
    below, above = [], []
    for value, half in zip(values, halves):
        v, h = float(value), _finite(half)
        below.append(0.0 if math.isnan(v) else max(0.0, min(h, v - lo)))
        above.append(0.0 if math.isnan(v) else max(0.0, min(h, hi - v)))
    return [below, above]


def _grid(plt, nrows: int, ncols: int, *, panel_w: float, panel_h: float, legend_w: float = 0.0,
          legend_h: float = 0.0, **kw):
    """A figure of nrows x ncols panels with room for a legend beside (right, `legend_w` in) or below
    (`legend_h` in) them; returns (fig, axes, rect for tight_layout)."""
    w, h = panel_w * ncols + legend_w, panel_h * nrows + legend_h + 0.7
    fig, axes = plt.subplots(nrows, ncols, squeeze=False, figsize=(w, h), dpi=100, **kw)
    return fig, axes, (0, legend_h / h, 1 - legend_w / w, 1 - 0.35 / h)


def suptitle(fig, text: str, fontsize: float = 11) -> None:
    """The figure's title, each line wrapped to the figure's width (about 11 characters per inch at 11 points): one
    panel is narrow."""
    width = max(40, int(11 * fig.get_figwidth()))
    fig.suptitle("\n".join(textwrap.fill(line, width=width) for line in text.split("\n")), fontsize=fontsize)


def _dodge(i: int, k: int, width: float) -> float:
    """The offset of series i of k side by side around a shared x (total spread `width`)."""
    return 0.0 if k <= 1 else (i - (k - 1) / 2) * width / (k - 1)


def _plot_formula(ax, capacity_requests: float, max_n: int, style: str) -> None:
    """The formula min(1, C/N) as a curve over N in [1, max_n]."""
    grid = [1 + i * (max_n - 1) / 200 for i in range(201)]
    ax.plot(grid, [min(1.0, capacity_requests / n) for n in grid], style, lw=1,
            label=f"formula min(1, C/N), C = {capacity_requests:.2f} prompts per worker")


def ms_log_axis(axis, lo_ms: float, hi_ms: float) -> None:
    """Ticks of a log axis of milliseconds between `lo_ms` and `hi_ms` at 1-2-5 steps written out (20, 50, 100, 200,
    500, 1,000 ms) rather than as powers of ten; at finer steps when the range holds fewer than three of those. The
    axis must already be on a log scale (setting the scale resets the ticks)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    lo_ms, hi_ms = max(lo_ms, 1e-3), max(hi_ms, 2e-3)
    decades = range(math.floor(math.log10(lo_ms)), math.ceil(math.log10(hi_ms)) + 1)
    for steps in ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10.0 ** e for e in decades for m in steps if lo_ms <= m * 10.0 ** e <= hi_ms]
        if len(ticks) >= 3:
            break
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 10 else f"{v:g}"))
    axis.set_minor_locator(NullLocator())


def with_host_tier(router: str, row: dict[str, object], several_tiers: bool) -> str:
    """A series' router label, with its host (CPU) KV tier when the rows have several ("random +16 GiB CPU KV")."""
    gib = float(row.get("cpu_kv_gib", 0.0) or 0.0)
    return f"{router} +{gib:g} GiB CPU KV" if several_tiers else router


def _several_tiers(rows: Sequence[dict[str, object]]) -> bool:
    return len({float(r.get("cpu_kv_gib", 0.0) or 0.0) for r in rows}) > 1


def draw_hit_rate(
    aggregated: Sequence[dict[str, object]], *, capacity_requests: float,
    measured: dict[tuple[int, int, int], float], title: str, measured_label: str = "measured",
):
    """Request hit rate vs N as small multiples: a panel per worker count (columns) and concurrency (rows). In a
    panel, per router (and engine, if several) the mean over repeats at each simulated N with its 95 % t-interval as
    error bars, as markers only: no line joins them, since no N between them was simulated; the formula
    min(1, C/N) dashed; the measured points of exactly that (workers, concurrency) as black crosses beside the
    predictions (series side by side around each N). One legend below the panels."""
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
                hits = [float(r["request_hit_rate"]) for r in rows]
                err = clipped_err(hits, [r.get("request_hit_rate_ci95") for r in rows], hi=1.0)
                on = f" on {engine}" if several_engines else ""
                ax.errorbar(xs, hits, yerr=err, marker="osD^v"[i // 10 % 5],
                            ls="none", ms=5, color=colours[i % len(colours)], capsize=2.5, elinewidth=1.2,
                            label=f"kvsim {router}{on}")
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
                ax.set_xlabel("distinct prefixes N (count)")
            if ci == 0:
                ax.set_ylabel("request hit rate (fraction)")
    if all_n:
        axes[0][0].set_xlim(0, max(all_n) + 1.5 * spread + 0.5)
    labels = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            labels.setdefault(lab, h)
    order = sorted(labels, key=lambda lab: (lab.startswith("formula"), lab == measured_label, lab))
    # NOTE: one column of panels is too narrow for three legend entries abreast.
    fig.legend([labels[lab] for lab in order], order, loc="lower center", ncol=min(3, 2 * len(workers) - 1),
               fontsize=8, frameon=False)
    interval = (f"mean ± 95% CI (t) over {repeats} runs at each simulated N" if repeats > 1
                else "1 run at each simulated N: no interval")
    suptitle(fig, f"{title} ({interval})" + ("" if shown_measured else "; no measurement at these points"))
    fig.tight_layout(rect=rect)
    return fig


hit_rate_figure = as_png(draw_hit_rate)


_TTFT_MEASURED = (("ttft_p50", 0.50), ("ttft_p99", 0.99))
"""The reference's TTFT percentiles of all requests drawn on the CDFs: the metric and its quantile."""
_CDF_QUANTILES = (0.005, 0.995)
"""The quantiles the TTFT axis spans; each curve is cut to them (beyond, a handful of requests draw the curve, and
it would leave the axes)."""
_CDF_TICKS = (0.01, 0.1, 0.5, 0.9, 0.99)
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


def _cdf_steps(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of `values` within `_CDF_QUANTILES`: the sorted values at their plotting positions."""
    xs = np.sort(np.asarray(values, dtype=float))
    # NOTE: Hazen plotting positions (i + 0.5) / n keep every point off 0 and 1 on the logit axis.
    ys = (np.arange(xs.size) + 0.5) / max(1, xs.size)
    keep = (ys >= _CDF_QUANTILES[0]) & (ys <= _CDF_QUANTILES[1])
    return xs[keep], ys[keep]


def draw_ttft_cdf(outcomes: Sequence, *, title: str,
                  measured: dict[tuple[int, int, int], dict[str, float]] | None = None,
                  measured_group: tuple[str, str] | None = None):
    """The TTFT of all requests as CDFs, small multiples on the grid of `hit_rate_figure`: a column per worker
    count, a row per concurrency (and per router and engine when several ran, router by router); in a panel one
    curve per N (repeats pooled), a distinct colour each, on a logit quantile axis (0.5 % to 99.5 %) so that p90 and
    p99 read as well as the median, against TTFT on a log axis ticked in ms. A hit rate shows as the knee between
    the fast hits and the slow misses.

    `measured[(workers, N, concurrency)]` holds reference percentiles in ms (`ttft_p50`, `ttft_p99`): drawn on the
    panels of `measured_group` (the router and engine the reference ran) as black-edged diamonds at (ms, quantile),
    beside kvsim's same percentile, the mean over repeats with its 95 % t-interval (a hollow circle with bars).
    When (router, engine) groups x concurrencies pass `_TTFT_MAX_ROWS`, only `measured_group` (or the first group)
    is drawn, and the title says so. One legend right of the panels."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    measured = measured or {}
    runs: dict[tuple, list[list[float]]] = defaultdict(list)
    tiers = _several_tiers([o.row for o in outcomes])
    for o in outcomes:
        p = o.point
        router = with_host_tier(p.router, o.row, tiers)
        key = ((router, str(o.row.get("engine", "")), p.concurrency), p.workers, p.prefixes)
        runs[key].append([*o.ttft.hit_ms, *o.ttft.miss_ms])
    rows, note = ttft_panel_rows([k[0] for k in runs], measured_group)
    groups = sorted({r[:2] for r in rows})
    workers_list = sorted({k[1] for k in runs})
    prefixes = sorted({k[2] for k in runs})
    several_engines = len({g[1] for g in groups}) > 1
    palette = plt.get_cmap("tab10" if len(prefixes) <= 10 else "tab20").colors
    colours = {n: palette[i % len(palette)] for i, n in enumerate(prefixes)}
    fig, axes, rect = _grid(plt, len(rows), len(workers_list), panel_w=4.4, panel_h=3.3, legend_w=2.6,
                            sharex=True, sharey=True)
    drawn_ms: list[float] = []
    marks = []
    repeats = max((len(v) for v in runs.values()), default=1)
    for ri, (router, engine, conc) in enumerate(rows):
        for ci, workers in enumerate(workers_list):
            ax = axes[ri][ci]
            for n in prefixes:
                per_run = runs.get(((router, engine, conc), workers, n))
                if not per_run:
                    continue
                xs, ys = _cdf_steps([v for run in per_run for v in run])
                if xs.size:
                    ax.step(xs, ys, where="post", color=colours[n], lw=1.4)
                    drawn_ms += [float(xs[0]), float(xs[-1])]
                ref = measured.get((workers, n, conc), {}) if (router, engine) == measured_group else {}
                got = [(ref[m], q) for m, q in _TTFT_MEASURED if m in ref]
                for ms, q in got:
                    kvsim = t_interval(percentile(run, 100 * q) for run in per_run if run)
                    marks.append((ax, colours[n], ms, q, kvsim))
                    drawn_ms += [ms, kvsim.mean]
            ax.set_xscale("log")
            ax.set_yscale("logit")
            on = f" on {engine}" if several_engines else ""
            ax.set_title(f"{router}{on}, {workers} workers, concurrency {conc}", fontsize=9)
            ax.grid(alpha=0.3)
            if ri == len(rows) - 1:
                ax.set_xlabel("TTFT (ms, log scale)")
            if ci == 0:
                ax.set_ylabel("requests with TTFT ≤ x (%, logit scale)")
    finite = [v for v in drawn_ms if v > 0 and math.isfinite(v)] or [1.0, 1000.0]
    lo, hi = min(finite) / 1.15, max(finite) * 1.15
    estimate = None
    for ax, colour, ms, q, kvsim in marks:
        # NOTE: the interval of 2 or 3 runs' percentiles can reach below 0 ms or far beyond the curves: its bar
        # stops at the axis' ends.
        estimate = ax.errorbar([kvsim.mean], [q], xerr=clipped_err([kvsim.mean], [kvsim.half_width], lo=lo, hi=hi),
                               fmt="o", ms=9, mfc="none", mec=colour, ecolor=colour, mew=1.3, elinewidth=1.1,
                               capsize=3, zorder=6)
        ax.scatter([ms], [q], marker="D", s=30, color=colour, edgecolors="black", linewidths=0.9, zorder=7)
    for ax in axes.flat:
        ax.set_xlim(lo, hi)
        ms_log_axis(ax.xaxis, lo, hi)
        ax.set_ylim(*_CDF_QUANTILES)
        ax.set_yticks(_CDF_TICKS, [f"{100 * q:g} %" for q in _CDF_TICKS])
        ax.yaxis.set_minor_locator(plt.NullLocator())
    handles = [Line2D([], [], color=colours[n], lw=2, label=f"N = {n} prefixes") for n in prefixes]
    if estimate is not None:
        handles.append(Line2D([], [], color="0.6", marker="D", markeredgecolor="black", lw=0,
                              label="measured: all requests\np50 and p99"))
        estimate.set_label(f"kvsim: the same percentiles,\nmean ± 95% CI over {repeats} runs")
        handles.append(estimate)
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    suptitle(fig, f"{title}{note}")
    fig.tight_layout(rect=rect)
    return fig


ttft_cdf_figure = as_png(draw_ttft_cdf)


def draw_engines(aggregated: Sequence[dict[str, object]], *, capacity_requests: float,
                 measured: dict[tuple[int, int, int], float], measured_engine: str, title: str):
    """Engines side by side: a panel per worker count; per engine, at each simulated N, the request hit rate (filled,
    ±1 sd over repeats) and the full-hit rate (hollow; the gap between them is partial hits), markers only, the
    engines side by side; the formula and the measured points."""
    plt = _pyplot()
    workers = sorted({int(r["workers"]) for r in aggregated})
    engines = sorted({str(r["engine"]) for r in aggregated})
    fig, axes = plt.subplots(1, len(workers), squeeze=False, sharey=True, figsize=(5.2 * len(workers), 4.2), dpi=100)
    all_n = sorted({int(r["prefixes"]) for r in aggregated} | {n for (_, n, _) in measured})
    spread = 0.05 * (max(all_n) - min(all_n)) if len(all_n) > 1 else 0.4
    for ax, w in zip(axes[0], workers):
        pts = sorted((n, v) for (mw, n, _c), v in measured.items() if mw == w)
        k = len(engines) + bool(pts)
        for i, engine in enumerate(engines):
            rows = sorted((r for r in aggregated if int(r["workers"]) == w and r["engine"] == engine),
                          key=lambda r: int(r["prefixes"]))
            xs = [int(r["prefixes"]) + _dodge(i, k, spread) for r in rows]
            hits = [float(r["request_hit_rate"]) for r in rows]
            ax.errorbar(xs, hits, yerr=clipped_err(hits, [r["request_hit_rate_sd"] for r in rows], hi=1.0),
                        marker="o", ls="none", color=f"C{i}",
                        capsize=3, label=f"{engine}: request hit rate")
            ax.plot(xs, [float(r["full_hit_rate"]) for r in rows], ls="none", marker="o", mfc="none", ms=7,
                    color=f"C{i}", label=f"{engine}: full hits only")
        _plot_formula(ax, capacity_requests, max(all_n), "k:")
        if pts:
            ax.scatter([n + _dodge(k - 1, k, spread) for n, _ in pts], [p[1] for p in pts], marker="x", s=50,
                       color="black", zorder=5, label=f"measured ({measured_engine})")
        ax.set_title(f"{w} workers", fontsize=10)
        ax.set_xlabel("distinct prefixes N (count)")
        ax.set_xlim(0, max(all_n) + 1.5 * spread + 0.5)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("request or full-hit rate (fraction of requests)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (labels[i].startswith(("formula", "measured")), labels[i]))
    # NOTE: below the panels, never over the data (a legend at the right covered the last panel).
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    suptitle(fig, f"{title}, at each simulated N", fontsize=12)
    legend_h = 0.25 + 0.2 * math.ceil(len(order) / 3)
    fig.tight_layout(rect=(0, legend_h / 4.2, 1, 0.95))
    return fig


engine_figure = as_png(draw_engines)


_VARIED = {"workers": "workers (count)", "kv-gib": "GPU KV cache per worker (GiB)",
           "cpu-kv-gib": "host (CPU) KV cache per worker (GiB)"}
"""The axis label of what `kvsim plan capacity --vary` varies."""


def draw_plan(plans: Sequence, *, target_hit_rate: float | None, target_ttft_p99_ms: float | None,
              unit: str, title: str):
    """The target metric(s) vs the varied quantity: simulated means with 95 % intervals at the values simulated
    (markers only: the bisection simulates a few values, nothing between them), the analytic screen (dashed), one
    colour per router, each router's answer as a band, the target as a horizontal line. One legend right of the
    panels."""
    plt = _pyplot()
    panels = [p for p in ("hit", "ttft") if (p == "hit" and target_hit_rate is not None)
              or (p == "ttft" and target_ttft_p99_ms is not None)]
    fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(5.5 * len(panels) + 2.4, 4.5), dpi=100)
    varied = _VARIED.get(plans[0].vary, unit) if plans else unit
    for ax, panel in zip(axes[0], panels):
        for i, p in enumerate(plans):
            colour = f"C{i}"
            xs = [e.value for e in p.evaluations]
            if panel == "hit":
                ys = [e.hit_rate for e in p.evaluations]
                err = clipped_err(ys, [e.hit_rate_ci95 for e in p.evaluations], hi=1.0)
                if p.analytic_curve:
                    ax.plot([v for v, _ in p.analytic_curve], [h for _, h in p.analytic_curve], "--", color=colour,
                            lw=1, label=f"{p.router}: analytic screen")
            else:
                ys = [e.ttft_p99 for e in p.evaluations]
                err = clipped_err(ys, [e.ttft_p99_ci95 for e in p.evaluations])
            ax.errorbar(xs, ys, yerr=err, fmt="o", color=colour, capsize=3, label=f"{p.router}: simulated")
            if p.answer is not None:
                ax.axvline(p.answer, color=colour, alpha=0.3, lw=6, label=f"{p.router}: answer {p.answer:g} {unit}")
        target = target_hit_rate if panel == "hit" else target_ttft_p99_ms
        ax.axhline(target, color="black", lw=1, label="target")
        ax.set_xlabel(varied)
        ax.set_ylabel("request hit rate (fraction of requests)" if panel == "hit" else "TTFT p99 (ms)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(*axes[0][0].get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                       borderaxespad=0, fontsize=8, frameon=False)
    suptitle(fig, title)
    fig.tight_layout()
    return fig


plan_figure = as_png(draw_plan)


def draw_replay(stats, *, title: str):
    """Prefix reuse, and TTFT p50/p99, per time bin of the trace (by send time), as lines: the bins tile the trace."""
    plt = _pyplot()
    keys = sorted(stats.bins)
    minutes = [k * stats.bin_s / 60 for k in keys]
    bins = [stats.bins[k] for k in keys]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6), dpi=100)
    top.plot(minutes, [b.prefix_reuse for b in bins], marker=".", label="prefix reuse")
    top.set_ylabel("prefix reuse\n(cached / prompt tokens)")
    top.set_ylim(0, 1)
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    ttft = {q: [b.ttft_ms.percentile(q) for b in bins] for q in (50, 99)}
    for q, values in ttft.items():
        bottom.plot(minutes, values, marker=".", label=f"TTFT p{q}")
    bottom.set_yscale("log")
    finite = [v for values in ttft.values() for v in values if v > 0 and math.isfinite(v)] or [1.0, 1000.0]
    lo, hi = min(finite) / 1.2, max(finite) * 1.2
    bottom.set_ylim(lo, hi)
    ms_log_axis(bottom.yaxis, lo, hi)
    bottom.set_ylabel("TTFT (ms, log scale)")
    bottom.set_xlabel(f"trace time (min; a point per {stats.bin_s:g} s bin)")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
    suptitle(fig, title)
    fig.tight_layout()
    return fig


replay_figure = as_png(draw_replay)


def draw_timeline(rows: Sequence[dict[str, object]], *, instances: Sequence, end_s: float, title: str):
    """An autoscaled run over time (`timeline.csv`'s rows), one question per panel, sharing the time axis: the
    workers (ready, starting, draining: exact, from the `instances`' spans, not sampled per row), the load (arrivals
    and completions per second), the hit rate (all requests, and those served by workers ready for less than the
    cold window) and the TTFT p90. Launches are marked by dotted green lines and drains by dotted red ones on every
    panel, so that the cold-cache dip after a scale-out lines up with its cause."""
    plt = _pyplot()
    fig, axes, rect = _grid(plt, 4, 1, panel_w=9.0, panel_h=1.9, legend_w=1.9, sharex=True)
    t = [float(r["start_s"]) for r in rows] + [float(rows[-1]["end_s"])]

    def steps(key: str) -> list[float]:
        values = [float(r[key]) if r[key] != "" else math.nan for r in rows]
        return values + values[-1:]

    def rate(key: str) -> list[float]:
        values = [float(r[key]) / max(float(r["end_s"]) - float(r["start_s"]), 1e-12) for r in rows]
        return values + values[-1:]

    workers, load, hits, ttft = (a[0] for a in axes)
    changes = sorted({0.0, end_s, *(x for i in instances
                                    for x in (i.started_s, i.ready_s, i.drained_s, i.stopped_s)
                                    if x is not None and x <= end_s)})
    # NOTE: the phase just after each change holds until the next one.
    phases = [[i.phase_before(x + 1e-9) for i in instances] for x in changes]
    workers.stackplot(changes, *([p.count(name) for p in phases] for name in ("ready", "starting", "draining")),
                      step="post", labels=("ready", "starting", "draining"),
                      colors=("#4c72b0", "#dd8452", "#c44e52"), alpha=0.85)
    workers.set_ylabel("workers")
    load.step(t, steps("arrivals_rps"), where="post", label="arrivals (by send time)")
    load.step(t, rate("completions"), where="post", label="completions", linestyle="--")
    load.set_ylabel("requests / s")
    hits.step(t, steps("request_hit_rate"), where="post", label="all requests")
    hits.step(t, steps("cold_request_hit_rate"), where="post", label="served by a new worker\n(cold window)",
              color="#c44e52")
    hits.set_ylabel("request hit rate")
    hits.set_ylim(-0.02, 1.02)
    ttft.step(t, steps("ttft_p90_ms"), where="post", label="TTFT p90")
    ttft.set_ylabel("TTFT p90 (ms)")
    finite = [v for v in steps("ttft_p90_ms") if v == v]
    if finite and max(finite) > 10 * min(finite):
        ttft.set_yscale("log")
    ttft.set_xlabel("simulated time (s)")
    for ax in (workers, load, hits, ttft):
        for i in instances:
            if i.started_s > 0:
                ax.axvline(i.started_s, color="#55a868", linestyle=":", linewidth=1)
            if i.drained_s is not None:
                ax.axvline(i.drained_s, color="#c44e52", linestyle=":", linewidth=1)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    suptitle(fig, title + "\ndotted: workers launched (green), drained (red)")
    fig.tight_layout(rect=rect)
    return fig


timeline_figure = as_png(draw_timeline)
