"""The statistics every summary and study shares, each rule in one place: a rate from two counts, a percentile of
samples, the mean of repeated runs with its Student-t interval, when two such means are told apart (and how many
repeats would tell them apart), where an interval lies against a limit, and the Pareto front of two metrics.

Runs, replays, validation, calibration, sweeps, comparisons, tuning and planning all call these, so that a rule
cannot drift between them (a 95 % interval that is Student-t in one study and normal in another, a standard
deviation that is 0 for one run here and NaN there).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # imported where used: a replay's summary takes no percentile of a list, and numpy is 40-60 ms
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
    import numpy as np

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


# --- when a winner is a winner ---------------------------------------------------------------------------------------
#
# THE RULE (kvsim's one rule for "A beats B", used by compare, tune and plan router): two means are separated when
# their 95 % Student-t intervals do not overlap,
#
#     |mean_a - mean_b| > half_width_a + half_width_b
#
# It is the rule a reader can check on the printed table (every value is shown as mean ± half-width), and it is
# conservative: for equal spreads it is a test at about the 99.4 % level, and it ignores that kvsim's candidates run on
# the same seeds (common random numbers), which a paired test would exploit. An answer it calls separated is one the
# table shows as separated; one it does not is "indistinguishable at this number of repeats".

def separated(a: Interval, b: Interval) -> bool | None:
    """Whether the means of `a` and `b` are told apart by THE RULE above (their intervals do not overlap); None when
    either has no interval (one run or none: nothing can be said)."""
    if any(math.isnan(x) for x in (a.mean, b.mean, a.half_width, b.half_width)):
        return None
    return abs(a.mean - b.mean) > a.half_width + b.half_width


def repeats_to_separate(a: Interval, b: Interval, confidence: float = 0.95, at_most: int = 100_000) -> float:
    """An estimate of the runs per candidate at which THE RULE would separate `a` and `b`, if their means and standard
    deviations stayed as observed: the smallest n >= 2 with

        t(1 - alpha/2, n - 1) x (sd_a + sd_b) / sqrt(n) < |mean_a - mean_b|

    (the two half-widths at n runs each shrink below the gap). An estimate, not a promise: the observed sds of 3 to 5
    runs are themselves uncertain. inf when the means are equal or n would exceed `at_most`; NaN without a standard
    deviation (fewer than two runs)."""
    spread = a.sd + b.sd
    gap = abs(a.mean - b.mean)
    if math.isnan(spread) or math.isnan(gap):
        return NAN
    if gap == 0:
        return math.inf
    if spread == 0:
        return 2.0
    import numpy as np
    from scipy.stats import t  # NOTE: here, as in t_interval

    n = np.arange(2, at_most + 1)
    ok = t.ppf(0.5 + confidence / 2, n - 1) * spread / np.sqrt(n) < gap
    return float(n[np.argmax(ok)]) if ok.any() else math.inf


LimitStatus = Literal["met", "not met", "undecided"]


def against_limit(interval: Interval, op: Literal["<=", ">="], limit: float) -> LimitStatus:
    """Where an interval lies against a limit (`value <= limit` or `value >= limit`): "met" when the whole interval
    meets it, "not met" when the whole interval fails it, "undecided" when the interval straddles the limit, or when
    there is no interval (one run: its mean alone does not decide)."""
    low, high = interval.mean - interval.half_width, interval.mean + interval.half_width
    if math.isnan(low) or math.isnan(high):
        return "undecided"
    if op == "<=":
        return "met" if high <= limit else "not met" if low > limit else "undecided"
    return "met" if low >= limit else "not met" if high < limit else "undecided"


@dataclass(frozen=True, slots=True)
class Standing:
    """How one candidate's mean stands against the others' under THE RULE (indices into the others given)."""

    tied: tuple[int, ...]
    """Others not separated from it (no interval counts as not separated), closest first."""
    ahead: tuple[int, ...]
    """Others separated from it and better."""
    settled: bool | None
    """Separated from every other and none ahead (True with no others); None when an interval is missing."""
    repeats_to_separate: float
    """`repeats_to_separate` from the tied one that needs the most runs (NaN when none is tied)."""

    @property
    def label(self) -> str:
        """The candidate's own verdict: "best" (settled), "not settled" or "no interval"."""
        return "no interval" if self.settled is None else "best" if self.settled else "not settled"

    def label_of(self, other: int) -> str:
        """Another candidate's verdict against it: "indistinguishable", "ahead" or "behind"."""
        return "indistinguishable" if other in self.tied else "ahead" if other in self.ahead else "behind"


def standing(of: Interval, others: Sequence[Interval], *, maximize: bool = True) -> Standing:
    """`of` against `others` (candidates compared on one metric, higher better when `maximize`)."""
    verdicts = [separated(of, o) for o in others]
    tied = sorted((i for i, v in enumerate(verdicts) if v is not True), key=lambda i: abs(others[i].mean - of.mean))
    ahead = [i for i, v in enumerate(verdicts)
             if v is True and (others[i].mean > of.mean if maximize else others[i].mean < of.mean)]
    settled = None if any(v is None for v in verdicts) else not tied and not ahead
    needed = [n for n in (repeats_to_separate(of, others[i]) for i in tied) if not math.isnan(n)]
    return Standing(tuple(tied), tuple(ahead), settled, max(needed) if needed else NAN)


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
