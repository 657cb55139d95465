"""The figures of router studies (PNG bytes; the CLI writes them): `kvsim compare` (hit rate against TTFT p99 with
the bound, the Pareto frontier, bars per router) and `kvsim tune` / `plan router` (trials, fronts)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sim.results.figures import _finite, _pyplot, as_png, clipped_err, suptitle

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


def _inside_lengths(boxes, p, q) -> np.ndarray:
    """The lengths (pixels) of the segments p-q inside the boxes (x0, y0, x1, y1), by Liang-Barsky clipping;
    numpy-broadcast: boxes (..., 4), p and q (..., 2)."""
    boxes, p, q = (np.asarray(v, dtype=float) for v in (boxes, p, q))
    d = q - p
    t0, t1 = 0.0, 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        for pk, qk in ((-d[..., 0], p[..., 0] - boxes[..., 0]), (d[..., 0], boxes[..., 2] - p[..., 0]),
                       (-d[..., 1], p[..., 1] - boxes[..., 1]), (d[..., 1], boxes[..., 3] - p[..., 1])):
            pk, qk = np.broadcast_arrays(pk, qk)
            t = qk / pk
            t0 = np.where(pk < 0, np.maximum(t0, t), t0)
            t1 = np.where(pk > 0, np.minimum(t1, t), t1)
            t1 = np.where((pk == 0) & (qk < 0), -1.0, t1)  # parallel to the edge and outside it
    return np.clip(t1 - t0, 0.0, None) * np.hypot(d[..., 0], d[..., 1])


def _overlap_areas(a, b) -> np.ndarray:
    """The areas (pixels²) of the intersections of boxes (x0, y0, x1, y1), numpy-broadcast."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    w = np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])
    h = np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])
    return np.clip(w, 0.0, None) * np.clip(h, 0.0, None)


def _box_distances(boxes, points) -> np.ndarray:
    """The distances (pixels) from points to the nearest points of boxes (0 inside), numpy-broadcast."""
    boxes, points = np.asarray(boxes, dtype=float), np.asarray(points, dtype=float)
    dx = np.maximum(np.maximum(boxes[..., 0] - points[..., 0], points[..., 0] - boxes[..., 2]), 0.0)
    dy = np.maximum(np.maximum(boxes[..., 1] - points[..., 1], points[..., 1] - boxes[..., 3]), 0.0)
    return np.hypot(dx, dy)


def _crossing(p1, p2, q1, q2) -> np.ndarray:
    """Whether the segments p1-p2 and q1-q2 cross (touching ends do not count), numpy-broadcast."""
    def side(a, b, c):
        return (b[..., 0] - a[..., 0]) * (c[..., 1] - a[..., 1]) - (b[..., 1] - a[..., 1]) * (c[..., 0] - a[..., 0])
    p1, p2, q1, q2 = (np.asarray(v, dtype=float) for v in (p1, p2, q1, q2))
    return (side(p1, p2, q1) * side(p1, p2, q2) < 0) & (side(q1, q2, p1) * side(q1, q2, p2) < 0)


def _drawn_segments(ax) -> tuple[np.ndarray, np.ndarray]:
    """Every line segment drawn in `ax` (lines, step lines, error bars, horizontal and vertical rules) in display
    space, as an (m, 2, 2) array, and the opacity of each (a faint error bar is easier to read a label across than
    a rule): what a label should not sit on."""
    from matplotlib.cbook import STEP_LOOKUP_MAP

    segments, alphas = [], []

    def add(artist, xy) -> None:
        pts = artist.get_transform().transform(np.asarray(xy, dtype=float))
        pairs = np.stack([pts[:-1], pts[1:]], axis=1)
        pairs = pairs[np.isfinite(pairs).all(axis=(1, 2))]
        segments.append(pairs)
        alphas.append(np.full(len(pairs), 1.0 if artist.get_alpha() is None else float(artist.get_alpha())))

    for line in ax.lines:
        if line.get_linestyle() in ("None", "none", "", " ") or len(line.get_xydata()) < 2:
            continue
        xy = np.asarray(line.get_xydata(), dtype=float)
        if line.get_drawstyle() in STEP_LOOKUP_MAP and line.get_drawstyle() != "default":
            xy = np.column_stack(STEP_LOOKUP_MAP[line.get_drawstyle()](xy[:, 0], xy[:, 1]))
        add(line, xy)
    for coll in ax.collections:
        for seg in getattr(coll, "get_segments", lambda: [])():
            if len(seg) >= 2:
                add(coll, seg)
    if not segments:
        return np.zeros((0, 2, 2)), np.zeros(0)
    return np.concatenate(segments), np.concatenate(alphas)


_LABEL_ANGLES = np.arange(0, 360, 15)
_LABEL_RINGS_PT = np.array([5, 10, 16, 24, 34, 46, 60, 76, 94, 116, 140, 170, 200])
_HARD = 1e4
"""The cost of covering another label, a point or a leader line: more than any move, so never taken while any
position is free."""
_AMBIGUOUS = 300.0
"""The cost of a label without a leader line that is as near another point as its own."""
_OUTSIDE = 1e8
"""The cost of a label outside the axes."""
_ON_LINE = 3.0
"""The cost of a pixel of an opaque line under a label's text (a faint one costs its opacity times that; a pixel of
distance costs 1)."""


class _Spots:
    """The candidate positions of one label, cheapest first, as arrays: text boxes (n, 4), leader lines from the
    point to the text (`tip` (2,), `attach` (n, 2); `led` False beside the point, where none is drawn), what each
    costs whatever the other labels do (`fixed`: distance, points and lines covered), offsets (points) and
    alignments."""

    def __init__(self, centre, size, centres, segments, alphas, frame, px_per_pt: float):
        radius, angle = np.meshgrid(_LABEL_RINGS_PT, np.radians(_LABEL_ANGLES), indexing="ij")
        dx, dy = (radius * np.cos(angle)).ravel(), (radius * np.sin(angle)).ravel()
        ha = np.where(dx > 1, 0, np.where(dx < -1, 2, 1))  # 0 left, 1 center, 2 right
        va = np.where(dy > 1, 0, np.where(dy < -1, 2, 1))  # 0 bottom, 1 center, 2 top
        (cx, cy), (w, h) = centre, size
        x0, y0 = cx + dx * px_per_pt - ha * w / 2, cy + dy * px_per_pt - va * h / 2
        boxes = np.column_stack([x0, y0, x0 + w, y0 + h])
        inside = ((boxes[:, 0] >= frame.x0) & (boxes[:, 2] <= frame.x1) & (boxes[:, 1] >= frame.y0)
                  & (boxes[:, 3] <= frame.y1))
        led = radius.ravel() > _LABEL_RINGS_PT[0]
        attach = np.column_stack([cx + dx * px_per_pt, cy + dy * px_per_pt])
        centres = np.asarray(centres, dtype=float)
        dots = np.column_stack([centres - 4.5, centres + 4.5])
        others = ~np.all(np.isclose(centres, centre), axis=1)
        fixed = px_per_pt * radius.ravel()
        if len(segments):
            fixed = fixed + _ON_LINE * (alphas * _inside_lengths(boxes[:, None, :], segments[None, :, 0],
                                                                 segments[None, :, 1])).sum(axis=1)
        covered = _overlap_areas(boxes[:, None, :], dots[None, :, :])
        fixed = fixed + np.where(covered > 0, _HARD + covered, 0.0).sum(axis=1)
        tip = np.asarray(centre, dtype=float)
        through = (_inside_lengths(dots[None, :, :], tip[None, None, :], attach[:, None, :]) > 0) & others
        fixed = fixed + np.where(led, _HARD * through.sum(axis=1), 0.0)
        # NOTE: a label without a leader line must be nearer its own point than any other, or it reads as theirs
        own = _box_distances(boxes, tip)
        near = (_box_distances(boxes[:, None, :], centres[None, :, :]) < own[:, None] + 4) & others
        fixed = fixed + np.where(led, 0.0, _AMBIGUOUS * near.sum(axis=1))
        # NOTE: outside the axes only when nothing inside is left (a panel too small for the text): a router is
        # never left unnamed
        fixed = fixed + np.where(inside, 0.0, _OUTSIDE)
        order = np.argsort(fixed, kind="stable")
        self.tip = tip
        self.boxes, self.attach, self.led, self.fixed = boxes[order], attach[order], led[order], fixed[order]
        self.offsets_pt = np.column_stack([dx, dy])[order]
        self.align = [(("left", "center", "right")[a], ("bottom", "center", "top")[b])
                      for a, b in zip(ha[order], va[order])]

    def clash(self, other: _Spots, k: int) -> np.ndarray:
        """What each candidate costs beside `other`'s candidate k: covering its text or leader line, or its leader
        line covering this text, `_HARD`; crossing leader lines 200."""
        box, attach, led = other.boxes[k], other.attach[k], other.led[k]
        area = _overlap_areas(self.boxes, box)
        cost = np.where(area > 0, _HARD + area, 0.0)
        cost += np.where(self.led & (_inside_lengths(box, self.tip, self.attach) > 0), _HARD, 0.0)
        if led:
            cost += np.where(_inside_lengths(self.boxes, other.tip, attach) > 0, _HARD, 0.0)
            cost += np.where(self.led & _crossing(self.tip, self.attach, other.tip, attach), 200.0, 0.0)
        return cost


class _Clashes:
    """`_Spots.clash` of every pair of labels, each computed once (the search asks for the same pairs again and
    again)."""

    def __init__(self, spots: Sequence[_Spots]):
        self.spots, self.memo = spots, {}

    def __call__(self, i: int, j: int, k: int) -> np.ndarray:
        if (i, j, k) not in self.memo:
            self.memo[(i, j, k)] = self.spots[i].clash(self.spots[j], k)
        return self.memo[(i, j, k)]

    def costs(self, i: int, placed: dict[int, int]) -> np.ndarray:
        """What each candidate of label i costs, the other labels where `placed` (label -> candidate) puts them."""
        return self.spots[i].fixed + sum((self(i, j, k) for j, k in placed.items() if j != i),
                                         np.zeros(len(self.spots[i].fixed)))

    def total(self, placed: dict[int, int]) -> float:
        return float(sum(self.spots[i].fixed[k] + sum(self(i, j, kj)[k] for j, kj in placed.items() if j != i)
                         for i, k in placed.items()))


def _place_labels(ax, points: Sequence[tuple[float, float, str, str]], *, fontsize: float = 7) -> list:
    """Label each (x, y, text, colour) point beside it, text never over another label, a point or a leader line,
    inside the axes, and as little as it can over lines and error bars: each label takes the cheapest of rings of
    candidate positions around its point (covering a label, point or leader line costs `_HARD`, a pixel of line
    under the text `_ON_LINE`, a pixel of distance 1; a label without a leader line as near another point as its
    own `_AMBIGUOUS`). Labels of crowded points are placed first, then all are placed again against the others; a
    label pushed from its best position then tries its cheapest positions with the labels in its way placed
    again, and keeps the arrangement that costs less in all. A label beyond the first ring gets a thin leader
    line. Returns the annotations.

    NOTE: computed in display space on the laid-out figure (each text box measured once and moved arithmetically),
    so the layout must not change afterwards. Deterministic: no randomness, a fixed order."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    px_per_pt = fig.dpi / 72
    centres = [tuple(map(float, c)) for c in ax.transData.transform([(x, y) for x, y, _, _ in points])]
    segments, alphas = _drawn_segments(ax)
    spots = []
    for i, (_, _, text, _) in enumerate(points):
        probe = ax.text(0, 0, text, fontsize=fontsize)
        box = probe.get_window_extent(renderer)
        probe.remove()
        spots.append(_Spots(centres[i], (box.width, box.height), centres, segments, alphas, frame, px_per_pt))
    crowding = [sum(math.dist(c, d) < 60 for d in centres) for c in centres]
    order = [i for i in sorted(range(len(points)), key=lambda i: (-crowding[i], i))
             if math.isfinite(centres[i][0]) and math.isfinite(centres[i][1])]
    clashes = _Clashes(spots)
    placed: dict[int, int] = {}
    for _ in range(2):
        for i in order:
            placed.pop(i, None)
            placed[i] = int(np.argmin(clashes.costs(i, placed)))
    for _ in range(3):  # NOTE: a local search: move a displaced label and the labels in its way together
        before = clashes.total(placed)
        for i in order:
            now = clashes.costs(i, placed)[placed[i]]
            for k in range(min(40, placed[i])):
                if spots[i].fixed[k] >= now:
                    break
                trial = {**placed, i: k}
                for j in [j for j in placed if j != i and clashes(j, i, k)[placed[j]] > 0]:
                    trial.pop(j)
                    trial[j] = int(np.argmin(clashes.costs(j, trial)))
                if clashes.total(trial) < clashes.total(placed):
                    placed = trial
                    break
        if clashes.total(placed) >= before:
            break
    annotations = []
    for i, k in sorted(placed.items()):
        x, y, text, colour = points[i]
        (ha, va), leader = spots[i].align[k], bool(spots[i].led[k])
        relpos = ({"left": 0.0, "right": 1.0, "center": 0.5}[ha], {"bottom": 0.0, "top": 1.0, "center": 0.5}[va])
        annotations.append(ax.annotate(
            text, (x, y), xytext=tuple(spots[i].offsets_pt[k]), textcoords="offset points", ha=ha, va=va,
            fontsize=fontsize, color=colour, arrowprops=dict(arrowstyle="-", lw=0.8, color=colour, shrinkA=0,
                                                             shrinkB=3, relpos=relpos) if leader else None))
    return annotations


def _coincident(centres: Sequence[tuple[float, float]], within_px: float = 7.0) -> list[list[int]]:
    """Indices of points drawn on the same spot, in their order: groups in which every two points are within
    `within_px` (their markers, 6 to 8 px across, cover each other), merged closest first (complete linkage, so that
    a chain of near points does not become one group)."""
    groups = [[i] for i in range(len(centres))]

    def diameter(g: list[int]) -> float:
        return max((math.dist(centres[i], centres[j]) for i in g for j in g), default=0.0)

    while True:
        pairs = [(diameter(a + b), ai, bi) for ai, a in enumerate(groups) for bi, b in enumerate(groups) if ai < bi]
        best = min(pairs, default=None)
        if best is None or best[0] > within_px:
            return sorted(sorted(g) for g in groups)
        _, ai, bi = best
        groups = [g for k, g in enumerate(groups) if k not in (ai, bi)] + [groups[ai] + groups[bi]]


def draw_compare(aggregated: Sequence[dict[str, object]], *, capacity_requests: float | None, title: str):
    """Hit rate against TTFT p99, a panel per (workers, N, concurrency): each router a labelled point with its 95 %
    intervals in both directions, the Pareto frontier (highest hit rate for a TTFT p99) in red, as a step line
    through its routers where it has two or more, the bound as a dashed line and random routing's expectation
    min(1, C/N) as a dotted one. Labels never cover one another or a point (`_place_labels`); routers drawn on the
    same spot share one label, a name a line. For a trace, prefix reuse instead of the hit rate and the reuse
    available as the bound."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    points = _by_point(aggregated)
    nrows, ncols, cells = _point_grid([p for p, _ in points])
    width, height = (8.0, 6.0) if len(points) == 1 else (6.6, 5.2)
    fig, axes = plt.subplots(nrows, ncols, squeeze=False, figsize=(width * ncols, height * nrows + 0.9), dpi=110)
    _hide_unused(axes, cells)
    labels = []
    longest_front = 0
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
            ax.errorbar([x], [y], xerr=clipped_err([x], [ex]), yerr=clipped_err([y], [ey], hi=1.0), fmt="none",
                        ecolor=colour, elinewidth=0.8, capsize=2, alpha=0.45, zorder=3)
            ax.plot([x], [y], "o", ms=5.5 if a["on_front"] else 4.5, color=colour, zorder=4)
        front = sorted((x, y) for x, y, a in zip(xs, ys, block) if a["on_front"])
        longest_front = max(longest_front, len(front))
        if len(front) >= 2:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color=_FRONT_COLOUR, lw=1.2,
                    alpha=0.6, zorder=2)
        _bound_lines(ax, block[0], capacity_requests, horizontal=True)
        finite = [(x, e) for x, e in zip(xs, xerr) if not math.isnan(x)] or [(1.0, 0.0)]
        lo, hi = min(max(0.0, x - e) for x, e in finite), max(x + e for x, e in finite)
        span = max(hi - lo, 1e-9)
        ax.set_xlim(max(0.0, lo - 0.12 * span), hi + 0.25 * span)
        ax.set_ylim(0, _fraction_top([_finite(block[0]["bound"]),
                                      *(min(1.0, _finite(y) + e) for y, e in zip(ys, yerr))]))
        ax.set_xlabel("TTFT p99 (ms)")
        ax.set_ylabel(_primary_label(capacity_requests))
        ax.set_title(_point_title(point), fontsize=10)
        ax.grid(alpha=0.3)
        labels.append((ax, xs, ys, [str(a["router"]) for a in block], colours))
    handles = [
        Line2D([], [], color=_FRONT_COLOUR, marker="o", lw=1.2 if longest_front >= 2 else 0,
               label="Pareto frontier" if longest_front >= 2 else "on the Pareto frontier"),
        Line2D([], [], color=_OTHER_COLOUR, marker="o", lw=0,
               label=f"dominated: another router {'reuses' if capacity_requests is None else 'hits'} more at a lower "
                     f"TTFT p99"),
        Line2D([], [], color="black", marker="|", lw=0.8, label="bars: 95% CI over repeats"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3 if ncols > 1 else 1, fontsize=8, frameon=False)
    suptitle(fig, title)
    # NOTE: labels are placed in display space, so the layout is fixed first and not changed after.
    fig.tight_layout(rect=(0, 0.75 / (height * nrows + 0.9), 1, 0.98))
    fig.canvas.draw()
    for ax, xs, ys, names, colours in labels:
        centres = ax.transData.transform(list(zip(xs, ys)))
        jobs = []
        for group in _coincident([tuple(c) for c in centres]):
            group = [i for i in group if not (math.isnan(xs[i]) or math.isnan(ys[i]))]
            x, y = sum(xs[i] for i in group) / max(1, len(group)), sum(ys[i] for i in group) / max(1, len(group))
            # NOTE: one label per colour at the spot: the frontier's names stay red beside the others'
            for colour in dict.fromkeys(colours[i] for i in group):
                jobs.append((x, y, "\n".join(names[i] for i in group if colours[i] == colour), colour))
        _place_labels(ax, jobs)
    return fig


compare_figure = as_png(draw_compare)


def _fraction_end(values: Sequence[float]) -> float:
    """Where a fraction axis's data ends: 1 when the values reach past one half (the whole range reads as a share),
    else 15 % above the largest (a trace's reuse of a few per cent must not sit flat on the axis)."""
    top = max([0.0, *values])
    return 1.0 if top > 0.5 else max(1.15 * top, 0.01)


def _fraction_top(values: Sequence[float]) -> float:
    """The top of a fraction axis: a little headroom above `_fraction_end` on a full 0..1 axis."""
    end = _fraction_end(values)
    return 1.08 if end == 1.0 else end


def draw_compare_bars(aggregated: Sequence[dict[str, object]], *, capacity_requests: float | None, title: str):
    """The hit rate per router, highest at the top, as bars with 95 % intervals, a panel per point; the bound
    (dashed) and random routing's expectation (dotted); each bar labelled with its fraction of the bound."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

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
        ax.barh(list(ys), values, xerr=clipped_err(values, [a.get(f"{primary}_ci95") for a in rows], hi=1.0),
                height=0.65,
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
        # NOTE: at most six ticks: a trace's reuse ends near 0.4, where the default ticks every 0.05 collide.
        ticks = [t for t in MaxNLocator(nbins=6).tick_values(0, end) if 0 <= t <= end * 1.001]
        ax.set_xlim(0, 1.8 * end)  # room for the column of values inside the axes
        ax.set_xticks(ticks)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_xlabel(_primary_label(capacity_requests))
        ax.set_title(_point_title(point), fontsize=10, pad=26)
        ax.grid(axis="x", alpha=0.3)
    metric = "prefix reuse" if capacity_requests is None else "hit rate"
    suptitle(fig, f"{title}\nred: on the Pareto frontier of {metric} and TTFT p99 (kvsim compare's ★)", fontsize=10)
    fig.tight_layout()
    return fig


compare_bars_figure = as_png(draw_compare_bars)


def _column_end(column: str) -> float:
    """Where a summary column's values end: 1 for a fraction (a rate, a share, reuse), else no end (0 is the other
    end of every column a study ranks by)."""
    return 1.0 if column.endswith(("_rate", "_fraction", "_share", "reuse")) else math.inf


def column_label(column: str) -> str:
    """An axis label for a summary column, with its unit (`ttft_p99_ms` -> "TTFT p99 (ms)")."""
    known = {"request_hit_rate": "request hit rate (fraction of requests)",
             "full_hit_rate": "full-hit rate (fraction of requests)",
             "token_hit_rate": "token hit rate (fraction of prompt tokens)",
             "throughput_rps": "throughput (requests/s)", "workers": "workers (count)", "kv-gib": "KV cache per worker (GiB)"}
    if column in known:
        return known[column]
    if column.startswith("ttft_") and column.endswith("_ms"):
        return "TTFT " + column.removeprefix("ttft_").removesuffix("_ms").replace("_", " ") + " (ms)"
    for suffix, unit in (("_ms", "ms"), ("_rps", "requests/s"), ("_s", "s"), ("_rate", "fraction"),
                         ("_fraction", "fraction"), ("_share", "fraction")):
        if column.endswith(suffix):
            return f"{column} ({unit})"
    return column


def draw_tune(result, *, title: str):
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
        err = [clipped_err(v, [t.ci95.get(c, nan) for t in front], hi=_column_end(c))
               for v, c in ((xs, mx.column), (ys, my.column))]
        ax.errorbar(xs, ys, xerr=err[0], yerr=err[1], fmt="o", color="C2", ms=5, capsize=2, lw=1,
                    label=f"Pareto front ({len(front)}), 95% CI" if len(front) < 2 else None)
        if len(front) >= 2:  # NOTE: a staircase needs two points; a lone front point is drawn as a point only
            ax.step(xs, ys, where="pre" if mx.maximize else "post", color="C2", lw=1.5,
                    label=f"Pareto front ({len(front)}), 95% CI")
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
    return fig


tune_figure = as_png(draw_tune)


def draw_choose_router(choice, *, title: str):
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
        ci = [clipped_err([v], [t.ci95.get(c, nan)], hi=_column_end(c)) for v, c in ((x, mx.column), (y, my.column))]
        mark = " (answer)" if i == choice.best else "" if t.feasible else " (infeasible)"
        settings = "".join(f"\n  {k}={format_value(v)}" for k, v in t.params.items()) if not t.is_baseline else (
            "\n  defaults" if t.params else "")
        ax.errorbar([x], [y], xerr=ci[0], yerr=ci[1], fmt="*" if i == choice.best else "o",
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
    return fig


choose_router_figure = as_png(draw_choose_router)
