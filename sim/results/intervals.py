"""Intervals of a mean over repeated runs (repeats of a sweep point, routers in a comparison)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from scipy import stats as _scipy_stats


@dataclass(frozen=True, slots=True)
class Interval:
    """The mean of n runs, their standard deviation (n - 1 in the denominator) and the half-width of the two-sided
    Student-t interval of the mean, t(1 - alpha/2, n - 1) x sd / sqrt(n); sd and half-width are nan below two runs,
    everything is nan without one."""

    mean: float
    sd: float
    half_width: float
    n: int


def t_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """The interval of the mean of `values` (nan values, e.g. the miss TTFT of a run without misses, left out)."""
    xs = [float(v) for v in values if not math.isnan(float(v))]
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(xs)
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1)
    sd = statistics.stdev(xs)
    t = float(_scipy_stats.t.ppf(0.5 + confidence / 2, n - 1))
    return Interval(mean, sd, t * sd / math.sqrt(n), n)
