"""The statistics every summary and study shares, each rule in one place: a rate from two counts, a percentile of
samples, the mean of repeated runs with its Student-t interval, and the Pareto front of two metrics.

Runs, replays, validation, calibration, sweeps, comparisons, tuning and planning all call these, so that a rule
cannot drift between them (a 95 % interval that is Student-t in one study and normal in another, a standard
deviation that is 0 for one run here and NaN there).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

NAN = float("nan")


def ratio(part: float, whole: float) -> float:
    """`part / whole`, NaN when `whole` is 0 (nothing counted: no requests, no prompt tokens, no time)."""
    return part / whole if whole else NAN


def per_second(count: float, span_s: float) -> float:
    """`count / span_s`, NaN over no time (or, for a replay without requests, a negative span)."""
    return count / span_s if span_s > 0 else NAN


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The q-th percentile (0..100) of `values`, numpy's linear interpolation; NaN when there are none."""
    return float(np.percentile(np.asarray(values), q)) if len(values) else NAN


@dataclass(frozen=True, slots=True)
class Interval:
    """The mean of n runs, their standard deviation (n - 1 in the denominator) and the half-width of the two-sided
    Student-t interval of the mean, t(1 - alpha/2, n - 1) x sd / sqrt(n).

    With one run the mean is that run's value and `sd` and `half_width` are NaN (one run says nothing of the
    spread); with none everything is NaN."""

    mean: float
    sd: float
    half_width: float
    n: int

    def columns(self, name: str) -> dict[str, float]:
        """The interval as the columns of an aggregated row: `name` (the mean), `name_sd`, `name_ci95`."""
        return {name: self.mean, f"{name}_sd": self.sd, f"{name}_ci95": self.half_width}


def t_interval(values: Iterable[float | None], confidence: float = 0.95) -> Interval:
    """The interval of the mean of `values`; NaN values (the miss TTFT of a run without misses) and None (a column a
    row lacks) are left out.

    NOTE: Student t, not the normal z = 1.96: studies repeat a point 3 to 5 times, where t(0.975, 2) = 4.30 and
    t(0.975, 4) = 2.78 (an interval with z at 3 runs is 2.2 times too narrow)."""
    xs = [x for x in (NAN if v is None else float(v) for v in values) if not math.isnan(x)]
    n = len(xs)
    if n == 0:
        return Interval(NAN, NAN, NAN, 0)
    mean = statistics.fmean(xs)
    if n == 1:
        return Interval(mean, NAN, NAN, 1)
    from scipy.stats import t  # NOTE: here, so that importing the summaries (and a replay) does not load scipy

    sd = statistics.stdev(xs)
    return Interval(mean, sd, float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n), n)


def over_runs(rows: Sequence[Mapping[str, object]], columns: Iterable[str]) -> dict[str, Interval]:
    """Per column, the interval of its values over `rows` (repeated runs of one configuration): the one aggregation
    of sweeps, comparisons, tuning and plans. A row without the column, or with None or NaN in it, is left out."""
    return {c: t_interval(_value(row.get(c)) for row in rows) for c in columns}


def _value(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


def pareto_front(points: Sequence[tuple[float, float]], maximize: tuple[bool, bool] = (True, False)) -> list[bool]:
    """Per point (a, b), whether no other point dominates it: is at least as good in both metrics and better in one
    (`maximize` says, per metric, whether higher is better; the default: a hit rate up, a latency down). Equal
    points do not dominate each other, so they are on the front together; a point with a NaN never is.

    O(n log n): turn both metrics into "lower is better", sort (first metric, then second), and keep the best
    second value seen so far:

        dominated(p) <=> some q sorted before p has q.b < p.b, or q.b == p.b and q.a < p.a
    """
    sign = (-1.0 if maximize[0] else 1.0, -1.0 if maximize[1] else 1.0)
    keyed = sorted((sign[0] * a, sign[1] * b, i) for i, (a, b) in enumerate(points)
                   if not (math.isnan(a) or math.isnan(b)))
    on = [False] * len(points)
    best_b = math.inf
    best_a = math.inf  # the smallest a among the points with b == best_b (the first of them in sorted order)
    for a, b, i in keyed:
        if b < best_b:
            best_b, best_a = b, a
            on[i] = True
        elif b == best_b and a == best_a:
            on[i] = True  # a duplicate of a front point
    return on
