"""The figures of router studies (PNG bytes; the CLI writes them): `kvsim compare` (hit rate against TTFT p99 with
the bound, the Pareto frontier, bars per router) and `kvsim tune` / `plan router` (trials, fronts)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from sim.results.figures import _finite, _png, _pyplot

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
    fig.tight_layout(rect=rect)
    return _png(fig)


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
    fig.tight_layout()
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
    from sim.routing.spec import format_value

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
    fig.tight_layout()
    return _png(fig)


def choose_router_figure(choice, *, title: str) -> bytes:
    """`kvsim plan router`: every router's trials in the plane of the two Pareto metrics, a colour per
    router (its trials faint, its default a diamond, its answer a large marker with 95 % intervals), the
    constraints on either metric as lines."""
    from sim.routing.spec import format_value

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
    fig.tight_layout()
    return _png(fig)
