"""What can be checked of a drawn figure without eyes: texts that overlap, leader lines through texts, data outside
the axes, axes without a label or a unit. Each check returns what it found (empty when the figure passes), so a
failing test names the culprits."""

from __future__ import annotations

import re

import numpy as np
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.text import Annotation, Text

_UNIT = re.compile(r"(?<!\w)(?:ms|s|GiB|fraction|count|min)(?!\w)|%|/")
"""What a unit in parentheses looks like: `(ms)`, `(fraction of requests)`, `(cached / prompt tokens)`, `(%, logit
scale)`."""


def has_unit(label: str) -> bool:
    """Whether an axis label names its unit in parentheses."""
    return any(_UNIT.search(group) for group in re.findall(r"\(([^()]*)\)", label))


def _drawn(fig) -> None:
    fig.canvas.draw()


def text_box(text: Text, renderer):
    """The box of a text's glyphs only (an annotation's own extent also covers its leader line)."""
    return Text.get_window_extent(text, renderer)


def texts(fig) -> list[Text]:
    """Every visible, non-empty text of the figure: titles, axis and tick labels, legends, annotations."""
    _drawn(fig)
    found: list[Text] = list(fig.texts)
    if fig._suptitle is not None:
        found.append(fig._suptitle)
    for legend in fig.legends:
        found += legend.get_texts()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(lo, hi), max(lo, hi)
            found += [t.label1 for t in axis.get_major_ticks()
                      if t.label1.get_visible() and lo - 1e-9 * abs(hi - lo) <= t.get_loc() <= hi + 1e-9 * abs(hi - lo)]
        if ax.get_legend() is not None:
            found += ax.get_legend().get_texts()
    return [t for t in dict.fromkeys(found) if t.get_visible() and t.get_text().strip()]


def overlapping_texts(fig, *, slack_px: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of texts whose boxes overlap by more than `slack_px` both ways."""
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), text_box(t, renderer)) for t in texts(fig)]
    found = []
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1:]:
            w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
            h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            if w > slack_px and h > slack_px:
                found.append((a, b))
    return found


def leaders_through_texts(fig) -> list[tuple[str, str]]:
    """(label, text) pairs where the label's leader line passes through another text's box."""
    renderer = fig.canvas.get_renderer()
    boxes = [(t, text_box(t, renderer)) for t in texts(fig)]
    found = []
    for ann in (t for t, _ in boxes if isinstance(t, Annotation) and t.arrow_patch is not None):
        path = ann.arrow_patch.get_path()
        points = ann.arrow_patch.get_transform().transform(path.vertices)
        for other, box in boxes:
            if other is ann:
                continue
            inner = box.padded(-1)
            if any(_crosses(inner, p, q) for p, q in zip(points, points[1:])):
                found.append((ann.get_text(), other.get_text()))
    return found


def _crosses(box, p, q, steps: int = 50) -> bool:
    return any(box.contains(*(p + (q - p) * k / steps)) for k in range(steps + 1))


def data_outside_axes(fig) -> list[str]:
    """Every line, marker or error bar whose data lies outside its axes' limits (NaN left out)."""
    found = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        eps_x, eps_y = 1e-9 * (x1 - x0), 1e-9 * (y1 - y0)

        def outside(xy: np.ndarray) -> bool:
            xy = xy[np.isfinite(xy).all(axis=1)]
            return bool(((xy[:, 0] < x0 - eps_x) | (xy[:, 0] > x1 + eps_x)
                         | (xy[:, 1] < y0 - eps_y) | (xy[:, 1] > y1 + eps_y)).any())

        for line in ax.lines:
            if line.get_transform() != ax.transData:  # axhline/axvline: drawn in axes fractions on one side
                continue
            if outside(np.asarray(line.get_xydata(), dtype=float)):
                found.append(f"{ax.get_title()!r}: line {line.get_label()!r}")
        for coll in ax.collections:
            if isinstance(coll, LineCollection):
                for seg in coll.get_segments():
                    if len(seg) and outside(np.asarray(seg, dtype=float)):
                        found.append(f"{ax.get_title()!r}: bar {coll.get_label()!r}")
                        break
            elif isinstance(coll, PathCollection) and outside(np.asarray(coll.get_offsets(), dtype=float)):
                found.append(f"{ax.get_title()!r}: markers {coll.get_label()!r}")
    return found


def unlabelled_axes(fig) -> list[str]:
    """Axes (of a visible panel with data) whose x or y label is missing or has no unit in parentheses, counting
    the labels its shared row and column carry (small multiples name the axis once per row or column)."""
    found = []
    panels = [ax for ax in fig.axes if ax.get_visible() and (ax.lines or ax.collections or ax.patches)]
    for ax in panels:
        for which, getter in (("x", lambda a: a.get_xlabel()), ("y", lambda a: a.get_ylabel())):
            shared = (ax.get_shared_x_axes() if which == "x" else ax.get_shared_y_axes()).get_siblings(ax)
            labels = [getter(a) for a in shared if getter(a).strip()]
            categorical = which == "y" and any(t.get_text() and not _numeric(t.get_text())
                                               for t in ax.get_yticklabels())
            if not labels and not categorical:
                found.append(f"{ax.get_title()!r}: no {which} label")
            elif labels and not any(has_unit(lab) for lab in labels):
                found.append(f"{ax.get_title()!r}: {which} label {labels[0]!r} has no unit")
    return found


def _numeric(text: str) -> bool:
    try:
        float(text.replace("−", "-").replace(",", "").replace("%", "").strip())
        return True
    except ValueError:
        return False


def visible_lines(ax) -> list:
    """The lines of `ax` drawn with a line style through two or more points (error bars' own data lines, markers
    only, have none)."""
    return [line for line in ax.lines
            if line.get_linestyle() not in ("None", "none", " ", "") and len(line.get_xydata()) >= 2]
